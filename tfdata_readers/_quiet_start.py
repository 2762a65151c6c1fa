"""Keeps TensorFlow's start-up lines off the terminal when this package runs as a command line,
and shows them once, not twice, when launch/train_mirrored.py trains.

TensorFlow 2.21 writes its import-time lines (oneDNN, CUDA stubs, CPU features, "All log messages
before absl::InitializeLog()") straight to file descriptor 2, before its logging honours
`TF_CPP_MIN_LOG_LEVEL`; the only way to keep them off a command's output is to point that
descriptor elsewhere while TensorFlow is imported. They came twice because two of TensorFlow's
native modules, `_pywrap_tensorflow_internal` and the profiler's `_pywrap_profiler_plugin`
(imported by `import tensorflow` too), each carry their own copy of absl's logging and of the
CUDA stub, and each prints the banner and the same lines when it loads. Library users see
TensorFlow exactly as it is: this only acts for `python -m tfdata_readers.verify|inspect`, their
console scripts, and train_mirrored.py. A failing import replays what it wrote, so nothing is
hidden then.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import tempfile

__all__ = [
    "COMMAND_MODULES",
    "MISSING_TENSORFLOW",
    "distinct_start_up_lines",
    "import_tensorflow_for_command",
    "import_tensorflow_for_training",
    "import_tensorflow_quietly",
    "invoked_as_command",
]

# The prefix of a line of TensorFlow's native logging: severity and date, time, thread id.
_NATIVE_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")

MISSING_TENSORFLOW = (
    "needs TensorFlow, which the reader's extra installs: pip install 'images-to-tfrecords[read]' "
    "(from a clone: pip install '.[read]'), or install your own TensorFlow build, 2.21 or later"
)

COMMAND_MODULES = ("tfdata_readers.verify", "tfdata_readers.inspect")
COMMAND_SCRIPTS = ("verify-tfrecords", "inspect-tfrecords")


def invoked_as_command(orig_argv: list[str], argv0: str) -> bool:
    """Pure: whether the interpreter was started as one of this package's command lines."""
    for flag, value in itertools.pairwise(orig_argv):
        if flag == "-m" and value in COMMAND_MODULES:
            return True
    return os.path.basename(argv0) in COMMAND_SCRIPTS


def distinct_start_up_lines(text: str) -> list[str]:
    """Pure: the lines of ``text`` with every repeat dropped, a line of native logging counting as a
    repeat when it matches an earlier one without its time stamp and thread id."""
    seen: set[str] = set()
    kept = []
    for line in text.splitlines():
        key = _NATIVE_LOG_PREFIX.sub("", line)
        if key not in seen:
            seen.add(key)
            kept.append(line)
    return kept


def _import_tensorflow_capturing_fd2() -> str:
    """Imports TensorFlow with fd 2 pointed at a scratch file and returns what was written there;
    if the import fails, replays it on stderr first."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            scratch.seek(0)
            sys.stderr.write(scratch.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        scratch.seek(0)
        return scratch.read().decode(errors="replace")


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with its start-up lines dropped (replayed if the import fails).

    `TF_CPP_MIN_LOG_LEVEL` defaults to 3 (a user's own setting wins): after start-up, TensorFlow
    still logs a failed cuInit on machines without a GPU; every real problem these commands meet
    reaches them as an exception, which they print in one line.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
    _import_tensorflow_capturing_fd2()


def import_tensorflow_for_training(prog: str) -> None:
    """train_mirrored.py's import: TensorFlow's start-up lines are shown, each once (they say which
    devices training gets); without TensorFlow, one error line that says how to install it, and exit 2."""
    if "tensorflow" in sys.modules:
        return
    try:
        start_up = _import_tensorflow_capturing_fd2()
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        print(f"{prog}: error: this command {MISSING_TENSORFLOW}", file=sys.stderr)
        raise SystemExit(2) from None
    lines = distinct_start_up_lines(start_up)
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()


def import_tensorflow_for_command(prog: str) -> None:
    """What a command line calls once its arguments are parsed (so --help and a bad flag answer
    without TensorFlow): TensorFlow imported quietly when run as a command, else as it is; without
    TensorFlow installed, one error line that says how to install it, and exit 2."""
    try:
        if invoked_as_command(list(getattr(sys, "orig_argv", [])), sys.argv[0] if sys.argv else ""):
            import_tensorflow_quietly()
        else:
            import tensorflow  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        print(f"{prog}: error: this command {MISSING_TENSORFLOW}", file=sys.stderr)
        raise SystemExit(2) from None

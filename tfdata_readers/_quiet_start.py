"""Keeps TensorFlow's start-up lines off the terminal when this package runs as a command line.

TensorFlow 2.21 writes its import-time lines (oneDNN, CUDA stubs, CPU features, "All log messages
before absl::InitializeLog()") straight to file descriptor 2, before its logging honours
`TF_CPP_MIN_LOG_LEVEL`; the only way to keep them off a command's output is to point that
descriptor elsewhere while TensorFlow is imported. Library users (training scripts) see
TensorFlow exactly as it is: this only acts for `python -m tfdata_readers.verify|inspect` and
their console scripts. A failing import replays what it wrote, so nothing is hidden then.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile

__all__ = [
    "COMMAND_MODULES",
    "MISSING_TENSORFLOW",
    "import_tensorflow_for_command",
    "import_tensorflow_quietly",
    "invoked_as_command",
]

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


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with fd 2 pointed at a scratch file; replays that file if the import fails.

    `TF_CPP_MIN_LOG_LEVEL` defaults to 3 (a user's own setting wins): after start-up, TensorFlow
    still logs a failed cuInit on machines without a GPU; every real problem these commands meet
    reaches them as an exception, which they print in one line.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
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

"""What the job's console shows: the stderr of the local runner's worker processes, filtered."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from apache_beam.portability.api import beam_fn_api_pb2
from google.protobuf import text_format

from beam_jobs.command_line.termination import interrupted

# Beam's runner threads' tracebacks, shown with --log_level DEBUG only (the failure itself is one line).
_DETAILS = logging.getLogger("beam_jobs.details")

__all__ = ["HARNESS_CHATTER", "ConsoleFilter", "RelayedWorkerRecords", "TracebackFilter", "hide_worker_tracebacks"]

# Lines the local runner's SDK worker processes print at every start and stop, whatever log level
# they are given (they log before they receive it): nothing a user can act on.
HARNESS_CHATTER = re.compile(
    r"Logging handler created|semi_persistent_directory|Pipeline_options:|Python sdk harness (starting|exiting)"
    r"|Creating insecure|channel established|Initializing SDKHarness|Creating state cache|Creating client data"
    r"|No more requests from control plane|SDK Harness waiting|Closing all cached|Done consuming work"
    r"|Discarding unparseable args|apitools not found, and bigquery client libraries"
)

# The local runner relays each log record of its SDK workers through this logger, as
# "Worker: <the LogEntry protobuf in text format, on one line>".
_RELAY_LOGGER = "apache_beam.runners.portability.local_job_service"
_RELAY_FORMAT = "Worker: %s"


class RelayedWorkerRecords(logging.Filter):
    """Turns a worker's record relayed by the local runner back into its own message.

    Beam relays the whole LogEntry protobuf as text (``severity: INFO timestamp { seconds: ...``),
    which buried the job's one line per shard at --log_level INFO. The entry is parsed with
    protobuf's own text-format parser; records of the job's code then read as the job's own
    lines do, others say their source location. Records from the steps in ``drop_steps`` are
    dropped: the plan line, which the launching process prints from the progress file already.
    """

    def __init__(self, *, drop_steps: Sequence[str] = ()) -> None:
        super().__init__()
        self._drop_steps = tuple(drop_steps)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrites a relayed worker record in place as its own message; False drops a plan-step record."""
        if (
            record.name != _RELAY_LOGGER
            or record.msg != _RELAY_FORMAT
            or not isinstance(record.args, tuple)
            or not record.args
        ):
            return True
        try:
            entry = text_format.Parse(str(record.args[0]), beam_fn_api_pb2.LogEntry())
        except text_format.ParseError:  # Another Beam version's shape: shown as Beam gave it.
            return True
        ours = "/beam_jobs/" in entry.log_location
        if ours and entry.transform_id.rsplit("/", 1)[-1] in self._drop_steps:
            return False
        record.name = "beam_jobs.details" if ours else f"worker {entry.log_location}"
        record.msg = entry.message + (f"\n{entry.trace}" if entry.trace else "")
        record.args = None
        return True


# The line a Python traceback ends with: "package.SomeError: message" (or a bare "SomeError").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
_CHAIN_LINES = ("During handling of the above exception", "The above exception was the direct cause")


class TracebackFilter:
    """Feeds on lines and passes on every line except those of Python tracebacks.

    A state machine, since a chained traceback is several blocks joined by "During handling ..."
    lines and blank lines, and only the line after its last exception line tells that it ended.
    """

    def __init__(self) -> None:
        self._state = "out"  # "out", "in" (inside a traceback), "after" (after an exception line)

    def keep(self, line: str) -> bool:
        """Whether ``line`` passes: False for every line of a traceback, the lines that chain one included."""
        text = line.rstrip("\n")
        if self._state == "out":
            if text.startswith("Traceback (most recent call last):"):
                self._state = "in"
                return False
            return True
        if self._state == "after":
            if not text.strip() or text.startswith(_CHAIN_LINES) or text.startswith("Traceback (most recent"):
                self._state = "in" if text.startswith("Traceback") else "after"
                return False
            self._state = "out"
            return self.keep(line)
        # Inside: indented frames and source lines, until the unindented exception line.
        if text.startswith((" ", "\t")) or not text.strip():
            return False
        if _EXCEPTION_LINE.match(text):
            self._state = "after"
        return False


class ConsoleFilter:
    """What passes: no tracebacks, no harness chatter, and nothing at all once muted.

    ``terminal`` is where the user's console really is (the original stderr), and ``lock``
    serialises writes to it: a progress bar drawn there must clear itself before a line passes,
    so it installs its own ``write`` as ``sink``.
    """

    def __init__(self, terminal: TextIO | None = None) -> None:
        self._tracebacks = TracebackFilter()
        self.muted = False
        self.terminal: TextIO = terminal or sys.stderr
        self.lock = threading.Lock()
        self.sink: Callable[[str], None] | None = None

    def emit(self, line: str) -> None:
        """Passes a line that was kept to the sink, or straight to the terminal."""
        if self.sink is not None:
            self.sink(line)
            return
        with self.lock:
            try:
                self.terminal.write(line)
                self.terminal.flush()
            except (ValueError, OSError):  # Closed at the end of the run while a straggler still spoke.
                pass

    def mute(self) -> None:
        """Drops everything from now on: after Ctrl-C the dying workers print pages of noise."""
        self.muted = True

    def keep(self, line: str) -> bool:
        """Whether ``line`` reaches the console: not once muted, not in a traceback, not harness chatter."""
        # interrupted(): the workers that the signal reached print their dying words before the
        # main thread's handler can mute the console.
        if self.muted or interrupted():
            self.muted = True
            return False
        return self._tracebacks.keep(line) and not HARNESS_CHATTER.search(line)


@contextlib.contextmanager
def hide_worker_tracebacks(enabled: bool = True) -> Iterator[ConsoleFilter]:
    """Filters tracebacks and harness chatter out of everything written to this process's stderr
    file descriptor while the block runs, including by the worker processes it starts.

    The local runner's SDK workers inherit stderr and print each failed bundle's traceback to it
    with print(), outside logging's reach; the failure itself reaches the user as one line from
    the job's entry point. The runner's own threads (``beam_control_read``, ``run_worker``) raise
    too when a worker dies, and Python prints those tracebacks, two at once and interleaved, so
    that no line filter can tell them apart: while the block runs they go to the log at DEBUG
    instead. With ``enabled`` False (--log_level DEBUG) nothing is filtered.
    """
    if not enabled:
        yield ConsoleFilter()
        return
    hook = threading.excepthook

    def log_thread_exception(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        _DETAILS.debug(
            "thread %s ended with %s: %s", name, args.exc_type.__name__, args.exc_value, exc_info=args.exc_value
        )

    threading.excepthook = log_thread_exception
    sys.stderr.flush()
    original = os.dup(2)
    terminal = os.fdopen(os.dup(original), "w", encoding="utf-8", errors="replace")
    console = ConsoleFilter(terminal)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        keep = console.keep
        with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if keep(line):
                    console.emit(line)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield console
    finally:
        threading.excepthook = hook
        sys.stderr.flush()
        os.dup2(original, 2)  # Closes the pipe's last write end held here: the pump sees EOF...
        os.close(original)
        # ...once the worker processes that inherited it have exited too.
        thread.join(timeout=5)
        console.sink = None
        with console.lock:
            terminal.close()

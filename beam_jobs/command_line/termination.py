"""The command's own word on an interrupt: the one line that says what the run left, and SIGTERM's
handler for the whole life of the command's process (before and after the guarded run).

The guard itself (SIGTERM as an interrupt, the watchdog, ending the workers) is the run's, in
beam_jobs/interruption.py; its names are re-exported here, where they were first imported from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from beam_jobs.command_line.program import PROG
from beam_jobs.interruption import (
    STUCK_AFTER_S,
    InterruptedState,
    Terminated,
    child_pids,
    interrupt_caught,
    interrupted,
    on_stuck,
    sigterm_as_interrupt,
    stop_child_processes,
)

if TYPE_CHECKING:
    import types

__all__ = [
    "interrupted_outside_the_run_line",
    "STUCK_AFTER_S",
    "InterruptedState",
    "Terminated",
    "child_pids",
    "interrupt_caught",
    "interrupted",
    "interrupted_line",
    "on_stuck",
    "sigterm_as_interrupt",
    "sigterm_ends_the_command",
    "state_outside_the_run",
    "stop_child_processes",
]


def interrupted_line(*, overwrite: bool, terminated: bool, state: InterruptedState | None = None) -> str:
    """The one line for an interrupted run (one with --overwrite, or not), saying what is true of
    what it left. Pure."""
    if state is None:  # Not known (the folder could not be read): say what holds in every case.
        outcome = (
            "any shards finished so far are staged: rerun with "
            f"{'--overwrite --resume' if overwrite else '--resume'} (and the same flags) to continue"
        )
    elif state.completed and state.plan_only:
        outcome = "the plan was already written (plan.json): nothing to rerun"
    elif state.completed:
        outcome = "the dataset was already complete (dataset_info.json written): nothing to rerun"
    elif state.staged:
        verb = "is" if state.staged == 1 else "are"
        outcome = (
            f"the {state.staged} shard{'s' if state.staged != 1 else ''} converted so far {verb} staged: "
            f"rerun with {'--overwrite --resume' if overwrite else '--resume'} (and the same flags) to continue"
        )
    else:
        outcome = "nothing was converted yet: rerun the same command to start again"
    if overwrite and not (state and state.completed):
        outcome += "; the dataset already there is untouched"
    return f"{PROG}: error: terminated (SIGTERM); {outcome}" if terminated else f"{PROG}: interrupted; {outcome}"


# What the command's SIGTERM line says outside a guarded run: whether its argv has --overwrite,
# and the state of its output (nothing yet before the run, the finished version after it).
_OUTSIDE: dict = {"overwrite": False, "state": InterruptedState()}


def state_outside_the_run(state: InterruptedState) -> None:
    """Says what SIGTERM's line reports from now on, outside the guarded run: a finished run's
    dataset (or plan) is complete while the process prints its summary and exits."""
    _OUTSIDE["state"] = state


def interrupted_outside_the_run_line() -> str:
    """The line for a Ctrl-C that lands outside the guarded run (during the imports before it, or
    its summary after it): what SIGTERM's line would say then, as an interrupt."""
    return interrupted_line(overwrite=_OUTSIDE["overwrite"], terminated=False, state=_OUTSIDE["state"])


# How long SIGTERM's line waits for stdout to take what was printed before it.
_FLUSH_WAIT_S = 2.0


def _flush_stdout() -> None:
    with contextlib.suppress(Exception):  # Closed, or a reader gone: nothing more to deliver.
        sys.stdout.flush()


def _end_outside_the_run(signum: int, frame: types.FrameType | None) -> None:  # pylint: disable=unused-argument
    """SIGTERM's handler before and after the guarded run: nothing is held there (no lock, no
    worker, no temp file), so the process writes its one line and ends at once. Raising instead
    would land in whatever runs then (an import half done, the interpreter's exit)."""
    if interrupted():  # The guarded run's own interrupt is on its way to its line and exit.
        return
    # The summary printed so far leaves before the line, unless stdout's reader has stopped
    # reading: the flush runs on a thread, and a stuck one is left behind.
    flushing = threading.Thread(target=_flush_stdout, name="flush-stdout", daemon=True)
    flushing.start()
    flushing.join(_FLUSH_WAIT_S)
    line = interrupted_line(overwrite=_OUTSIDE["overwrite"], terminated=True, state=_OUTSIDE["state"])
    with contextlib.suppress(OSError):
        # os.write: the signal may have come in the middle of a write to sys.stderr, which a
        # second write from this handler, on the same thread, would find locked.
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    os._exit(128 + signum)  # pylint: disable=protected-access


def sigterm_ends_the_command(argv: Sequence[str]) -> None:
    """Installs SIGTERM's handler for the whole life of the command's process, as its entry point
    begins (before its heavy imports): outside the guarded run (sigterm_as_interrupt, which hands
    the signal back here when it ends) SIGTERM prints the one line and exits 143 too, before the
    run starts and after its commit. Only the interpreter's own start, before the entry point
    runs, is left to Python's default (the process ends without a line)."""
    _OUTSIDE["overwrite"] = "--overwrite" in argv
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _end_outside_the_run)

"""SIGTERM handled as Ctrl-C is: a run stops, cleans up what it holds, and reports what it left.

A run (run.py) is guarded by ``sigterm_as_interrupt``: SIGTERM becomes ``Terminated``, a
KeyboardInterrupt, so one cleanup serves both signals; a watchdog ends what the interrupt never
reached. The one line the command prints for it is the command line's (command_line/termination.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import threading
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import types

__all__ = [
    "STUCK_AFTER_S",
    "InterruptedState",
    "Terminated",
    "child_pids",
    "interrupt_caught",
    "interrupted",
    "on_stuck",
    "sigterm_as_interrupt",
    "stop_child_processes",
]

_LOG = logging.getLogger(__name__)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM.

    A KeyboardInterrupt on purpose: every cleanup that an interrupt runs (releasing the lock,
    removing the progress file and the run's temp files, muting the dying workers) then runs for
    SIGTERM too, which `timeout`, Docker, Kubernetes and Slurm send to stop a job.
    """


# How long an interrupt may take to reach the job's own cleanup before the watchdog does it.
STUCK_AFTER_S = 10.0


class _Guard:
    """One guarded run: whether its interrupt reached the job's cleanup, and what to do if it
    never does."""

    def __init__(self, stuck_after_s: float) -> None:
        self.stuck_after_s = stuck_after_s
        self.caught = threading.Event()
        self.fallbacks: list[Callable[[int], None]] = []
        self._watching = False
        self.signalled = threading.Event()
        self._reading = threading.Lock()  # Held while signal bytes move from the pipe to ``signalled``.
        self._wakeup_fd: int | None = None

    def interrupted(self) -> bool:
        """Whether SIGTERM or SIGINT reached this process, exactly, from any thread.

        The C-level handler writes the signal's byte to the wakeup pipe before any thread of this
        process runs Python code again, so a byte still in the pipe counts as well as one the
        listener has read: a worker's death the signal caused is never seen before the signal.
        """
        with self._reading:
            if self.signalled.is_set() or self._wakeup_fd is None:
                return self.signalled.is_set()
            readable, _, _ = select.select([self._wakeup_fd], [], [], 0)
            return bool(readable)

    def listen(self, wakeup_fd: int) -> None:
        """Runs on a thread: reads the signal numbers Python's C-level handler writes to the wakeup
        fd, from whichever thread the kernel delivered the signal to. The Python-level handler
        only runs when the main thread next runs Python code, and a runner's main thread may be
        blocked for ever on a worker the signal killed; this thread is not."""
        self._wakeup_fd = wakeup_fd
        try:
            while True:
                select.select([wakeup_fd], [], [])
                with self._reading:
                    data = os.read(wakeup_fd, 64)
                    if not data:
                        self._wakeup_fd = None
                        break
                    if any(signum in (signal.SIGTERM, signal.SIGINT) for signum in data):
                        self.signalled.set()
                for signum in data:
                    if signum in (signal.SIGTERM, signal.SIGINT) and not self._watching:
                        self._watching = True
                        self._watch(signum)
        except OSError:
            pass
        finally:
            with self._reading:
                self._wakeup_fd = None
            with contextlib.suppress(OSError):
                os.close(wakeup_fd)  # Its write end was closed: the run is over.

    def _watch(self, signum: int) -> None:
        if self.caught.wait(self.stuck_after_s):
            return
        for fallback in self.fallbacks:
            with contextlib.suppress(Exception):
                fallback(signum)
        os._exit(128 + signum)  # pylint: disable=protected-access


_ACTIVE: _Guard | None = None
_LAST: _Guard | None = None  # The latest guarded run's, whose interrupt outlives its block.


def interrupted() -> bool:
    """Whether the guarded run (the one running, else the last one) was interrupted by a signal."""
    guard = _ACTIVE or _LAST
    return guard is not None and guard.interrupted()


def _quiet_after_interrupt(previous: Callable) -> Callable:
    """A threading.excepthook that, once the run was interrupted, logs a thread's death at DEBUG
    instead of printing it: the local runner's threads that wait on its workers die with the signal
    ("Worker subprocess exited with return code -15", grpc errors), which the one line from the
    job's entry point already explains. Before an interrupt, ``previous`` prints it as ever."""

    def hook(args: threading.ExceptHookArgs) -> None:
        if not interrupted():
            previous(args)
            return
        thread = args.thread.name if args.thread is not None else "?"
        _LOG.debug("thread %s ended after the interrupt", thread, exc_info=args.exc_value)

    return hook


def interrupt_caught() -> None:
    """Says that an interrupt reached the job's own cleanup, which the watchdog then leaves to it."""
    if _ACTIVE is not None:
        _ACTIVE.caught.set()


def on_stuck(fallback: Callable[[int], None]) -> None:
    """Registers what the watchdog does (given the signal's number), in order, when an interrupt
    never reaches the job's cleanup; the process then exits with 128 + the signal's number."""
    if _ACTIVE is not None:
        _ACTIVE.fallbacks.append(fallback)


@contextlib.contextmanager
def sigterm_as_interrupt(*, stuck_after_s: float = STUCK_AFTER_S) -> Iterator[None]:
    """While the block runs, the first SIGTERM raises Terminated; later ones are ignored, so that
    the cleanup the first one started is not itself cut short (a SIGKILL still ends it).

    An exception raised by a signal handler lands in whatever Python code the main thread runs
    next, which may be never (a runner waiting on a worker the signal killed) or code that
    swallows it. So a watchdog thread, told of each signal through the wakeup fd, runs the
    fallbacks given to on_stuck() and ends the process when an interrupt (SIGTERM or Ctrl-C) has
    not reached interrupt_caught() within ``stuck_after_s``.

    Python's default for SIGTERM is to die at once, running no ``finally`` block. Outside the main
    thread signal handlers cannot be set, and nothing changes.
    """
    global _ACTIVE, _LAST  # pylint: disable=global-statement
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    guard = _ACTIVE = _LAST = _Guard(stuck_after_s)
    previous_hook = threading.excepthook
    threading.excepthook = _quiet_after_interrupt(previous_hook)
    received = threading.Event()

    def _handler(signum: int, frame: types.FrameType | None) -> None:  # pylint: disable=unused-argument
        if not received.is_set():
            received.set()
            raise Terminated()

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    listener = threading.Thread(target=guard.listen, args=(read_fd,), name="signal-watchdog", daemon=True)
    listener.start()
    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.set_wakeup_fd(previous_fd)
        _ACTIVE = None
        if not guard.interrupted():
            # Left on after an interrupt: the runner's threads go on dying until the process exits.
            threading.excepthook = previous_hook
        os.close(write_fd)  # The listener reads EOF and ends (after any watch it is running).


@dataclasses.dataclass(frozen=True)
class InterruptedState:
    """What an interrupted run left in its output folder, for the one line that reports it.

    ``staged`` counts the staged shards of this run (sidecars naming its id, kept ones included);
    ``completed`` is true when this run had already written its dataset_info.json (its plan.json,
    with ``plan_only``).
    """

    staged: int = 0
    completed: bool = False
    plan_only: bool = False


def child_pids() -> frozenset[int]:
    """This process's children now: those a run must leave alone when it ends its own."""
    try:
        return frozenset(child.pid for child in psutil.Process().children())
    except psutil.Error:
        return frozenset()


def stop_child_processes(*, grace_s: float = 5.0, spare: Collection[int] = ()) -> list[int]:
    """Ends this process's descendants (the local runner's SDK workers) and waits for them.

    After an interrupt they may still be writing a shard's temp file; their temp files can only be
    removed once none of them can write another. Each gets SIGTERM, and SIGKILL after ``grace_s``.
    psutil, because the workers are grandchildren (Beam starts them through a shell) that the
    runner's own threads wait for, so ``os.waitpid`` here would steal their exit status. Returns
    the pids of those that could not be ended (none, normally).

    The children in ``spare`` (``child_pids()`` when the run began) and their descendants are not
    the run's: a notebook's or a test's own servers live on.
    """
    try:
        children = []
        for child in psutil.Process().children():
            if child.pid not in spare:
                children += [child, *child.children(recursive=True)]
    except psutil.Error:
        return []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    return [child.pid for child in alive]

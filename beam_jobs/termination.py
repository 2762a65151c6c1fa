"""SIGTERM handled as Ctrl-C is: the run stops, cleans up what it holds, and says how to resume."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import psutil

__all__ = ["Terminated", "sigterm_as_interrupt", "stop_child_processes"]


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM.

    A KeyboardInterrupt on purpose: every cleanup that an interrupt runs (releasing the lock,
    removing the progress file and the run's temp files, muting the dying workers) then runs for
    SIGTERM too, which `timeout`, Docker, Kubernetes and Slurm send to stop a job.
    """


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, the first SIGTERM raises Terminated; later ones are ignored, so that
    the cleanup the first one started is not itself cut short (a SIGKILL still ends it).

    Python's default for SIGTERM is to die at once, running no ``finally`` block. Outside the main
    thread signal handlers cannot be set, and nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = threading.Event()

    def _handler(signum, frame):  # pylint: disable=unused-argument
        if not received.is_set():
            received.set()
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_child_processes(*, grace_s: float = 20.0) -> list[int]:
    """Ends this process's descendants (the local runner's SDK workers) and waits for them.

    After an interrupt they may still be writing a shard's temp file; their temp files can only be
    removed once none of them can write another. Each gets SIGTERM, and SIGKILL after ``grace_s``.
    psutil, because the workers are grandchildren (Beam starts them through a shell) that the
    runner's own threads wait for, so ``os.waitpid`` here would steal their exit status. Returns
    the pids of those that could not be ended (none, normally).
    """
    try:
        children = psutil.Process().children(recursive=True)
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

"""Local workers started before the pipeline asks for them, so that their start-up overlaps the job's own.

A local worker spends about 1.5 s importing Beam, gRPC and the codecs before it can take work,
and Beam's FnApiRunner starts its workers only once the pipeline is built and submitted: on a
quiet 2-core machine that start was the largest single part of the 3.4 s from the command to the
first shard. So the command line starts its workers as its first act (one process imports what a
worker needs once, then forks a worker a core, each waiting on a Unix socket of its own:
local_worker.py), and the command the runner later runs for each worker is this module's small
launcher, which imports nothing of Beam:

- it claims one waiting worker by renaming that worker's socket (atomic: two launchers never
  claim one worker), hands it its environment (the control and logging endpoints and the pipeline
  options Beam passes each worker that way) and working folder, and then stands in for it: it
  exits with the worker's exit code once that worker has exited;
- with no warm worker to claim (none was started, all are taken, one died or timed out), or when
  the claimed worker ends before it starts its harness, it becomes an ordinary cold worker
  (``os.execv`` of local_worker.py), so a warm worker is only ever a head start.

A warm worker that is not claimed exits after IDLE_TIMEOUT_S, or with the job's process, as
every local worker does; the command line ends its unclaimed ones when the run is over. A
launcher killed by the runner ends its worker (the worker sees the socket close).

Which worker converts what, and with which threads, is still the runner's choice: the shards'
bytes do not depend on it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

__all__ = [
    "EXITED",
    "IDLE_TIMEOUT_S",
    "LAUNCHER_MODULE",
    "STARTED",
    "WarmWorkers",
    "current",
    "launcher_command",
    "start_warm_workers",
]

LAUNCHER_MODULE = "beam_jobs.warm_workers"
# How long a warm worker waits to be claimed. The pipeline's first stage runs seconds after the
# command starts, unless a run waits for another run's lock on its output folder.
IDLE_TIMEOUT_S = 300.0
_SOCKET_SUFFIX = ".sock"
# The longest Unix socket path every platform binds (Linux allows 107 bytes, macOS 103).
_SOCKET_PATH_LIMIT = 100
# What a claimed worker tells its launcher: "started PID" once it runs the harness, then "exited CODE".
STARTED = "started"
EXITED = "exited"
STANDARD_STREAMS = (0, 1, 2)

_current: WarmWorkers | None = None


class WarmWorkers:
    """The warm workers one command started: the process that forks them, and their sockets' folder."""

    def __init__(self, folder: str, process: subprocess.Popen) -> None:
        self.folder = folder
        self.process = process

    @property
    def pids(self) -> frozenset[int]:
        """The job's process's own child that the warm workers are (the forking one)."""
        return frozenset([self.process.pid])

    def close(self) -> None:
        """Ends what is left of the warm workers once the run is over (the unclaimed ones; the
        claimed ones have served the run and exited) and removes the folder."""
        if self.process.poll() is None:
            self.process.terminate()  # it ends its workers (local_worker._serve_warm)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        global _current  # pylint: disable=global-statement
        if _current is self:
            _current = None


def _socket_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"{index}{_SOCKET_SUFFIX}")


def start_warm_workers(count: int) -> WarmWorkers | None:
    """Starts ``count`` warm workers for this process's coming local run (current() returns them),
    or None where they cannot wait: no writable temporary folder, or one whose path is too long
    for a Unix socket's (then the runner starts its workers cold, as it would without them)."""
    global _current  # pylint: disable=global-statement
    try:
        folder = tempfile.mkdtemp(prefix="itt-warm-")
    except OSError:
        return None
    sockets = [_socket_path(folder, index) for index in range(count)]
    if any(len(os.fsencode(path)) > _SOCKET_PATH_LIMIT for path in sockets):
        shutil.rmtree(folder, ignore_errors=True)
        return None
    process = subprocess.Popen(  # pylint: disable=consider-using-with  # waited for by close()
        [sys.executable, "-m", "beam_jobs.local_worker", "--warm", str(os.getpid()), *sockets],
        # Its own session: a terminal's Ctrl-C reaches the command, whose cleanup ends every worker,
        # and never interrupts a waiting worker's wait (a traceback each).
        start_new_session=True,
    )
    _current = WarmWorkers(folder, process)
    return _current


def current() -> WarmWorkers | None:
    """The warm workers this process started for its run, if any."""
    return _current


def launcher_command(interpreter: str, runner_pid: int, folder: str) -> str:
    """The command line the runner runs for a worker when warm workers wait in ``folder`` (run
    by /bin/sh: the folder is quoted, as a temporary folder's path may hold spaces)."""
    return f"{interpreter} -m {LAUNCHER_MODULE} {runner_pid} {shlex.quote(folder)}"


def _claim(folder: str) -> socket.socket | None:
    """A connection to a waiting worker in ``folder`` that this launcher alone has claimed, or None."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(_SOCKET_SUFFIX))
    except OSError:
        return None
    for name in names:
        path = os.path.join(folder, name)
        claimed = f"{path}.{os.getpid()}"
        try:
            os.rename(path, claimed)  # the claim: only one launcher's rename of a name succeeds
        except OSError:
            continue
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(claimed)  # a bound socket is found by its file, whatever its name
        except OSError:
            connection.close()  # that worker has gone (timed out, or killed)
            continue
        finally:
            os.unlink(claimed)
        return connection
    return None


def _lines(connection: socket.socket):
    """The worker's messages, a line each, until it closes the connection (its exit)."""
    buffered = b""
    while True:
        chunk = connection.recv(4096)
        if not chunk:
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line.decode("utf-8")


def _exited(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone, or a zombie waiting for its parent (the job's process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return not _pid_exists(pid)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_standard_streams() -> list[int]:
    """Which of stdin, stdout and stderr this process has open (a runner may close one)."""
    opened = []
    for fd in STANDARD_STREAMS:
        try:
            os.fstat(fd)
        except OSError:
            continue
        opened.append(fd)
    return opened


def _stand_in(connection: socket.socket) -> int | None:
    """Hands the claimed worker this process's environment, folder and standard streams, then
    waits for it: its exit code, or None when it ended before starting its harness (then nothing
    of the run reached it).

    The streams travel as file descriptors (SCM_RIGHTS): the warm worker was forked before the
    job's console filter took the job's stderr, so without them a worker's dying traceback went
    straight to the user's terminal, past the filter a cold worker's output passes through."""
    streams = _open_standard_streams()
    request = {"cwd": os.getcwd(), "env": dict(os.environ), "streams": streams}
    socket.send_fds(connection, [json.dumps(request).encode("utf-8") + b"\n"], streams)
    pid, code = None, None
    for line in _lines(connection):
        kind, _, value = line.partition(" ")
        if kind == STARTED:
            pid = int(value)
        elif kind == EXITED:
            code = int(value)
    if pid is None:
        return None
    if code is None:
        return 1  # killed mid-run: the runner sees a failed worker, as it would see a cold one
    while not _exited(pid):  # as Beam waits for a cold worker's exit, so the run's end waits for this one's
        time.sleep(0.01)
    return code


def main(argv: Sequence[str] | None = None) -> None:
    """The launcher: ``python -m beam_jobs.warm_workers RUNNER_PID FOLDER`` (see the module docstring)."""
    argv = list(sys.argv if argv is None else argv)
    runner_pid, folder = argv[1], argv[2]
    # A terminal's Ctrl-C reaches this stand-in too: the command's cleanup ends the worker it
    # stands in for, and this process then exits with that worker's code, without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection = _claim(folder)
    if connection is not None:
        with connection:
            code = _stand_in(connection)
        if code is not None:
            sys.exit(code)
    os.execv(sys.executable, [sys.executable, "-m", "beam_jobs.local_worker", runner_pid])


if __name__ == "__main__":
    main()

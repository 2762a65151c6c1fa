"""The local runner's worker process: Beam's SDK harness, which ends with the process that runs the job.

Beam starts each local worker as ``python -m apache_beam.runners.worker.sdk_worker_main`` through
``/bin/sh -c``. Two things are added here:

- **It ends with the job's process.** A job killed outright (SIGKILL, the kernel's OOM killer)
  cleans up nothing, and Beam's workers outlived it: idle, holding a little CPU and the job's
  stdout, so whatever read that output (a CI step, ``subprocess.communicate``) hung. The worker
  is handed the pid of the process that runs the job and exits, with its children, once that
  process is gone. (Linux's parent-death signal would not do: the worker's parent is the shell,
  which outlives the job too.)
- **A quick exit.** Beam closes its workers one after another, waiting for each process to exit,
  and such a worker exits slowly: the interpreter's last garbage collections walk a heap of Beam,
  gRPC, numpy and the codecs (measured on 2 cores: 1.1-1.3 s a worker after converting photos, so
  2.5 s of a 15 s run of 8000 photos spent after the last shard was written; 0.45 s a worker even
  for a pipeline of 100 integers). Once the harness returns, every bundle has finished and been
  reported and the DoFns' teardown has run, so nothing in that heap needs collecting:
  ``gc.freeze()`` moves it out of the collector's sight, and the exit that follows runs as usual
  (threads joined, exit handlers run, multiprocessing's semaphores removed) without the walk
  (0.04 s a worker).

A harness that fails raises, and its process then exits as Python's does (with the traceback and
a non-zero code), so that the runner sees the failure as before.

``--warm RUNNER_PID SOCKET...`` starts the warm workers (warm_workers.py): one process imports
what a worker needs while the job builds its pipeline, then forks a worker a SOCKET, each waiting
for a launcher to hand it the environment the runner gave that launcher, to run the same harness.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import socket
import sys
import threading
import traceback

import psutil
from apache_beam.runners.worker import sdk_worker_main

from beam_jobs import warm_workers
from beam_jobs.third_party_warnings import warnings_to_debug_log

__all__ = ["RUNNER_GONE_EXIT_CODE", "main"]

# How often a worker looks for the job's process, and its exit code once that process is gone.
_WATCH_INTERVAL_S = 0.5
RUNNER_GONE_EXIT_CODE = 3
# The warm workers' socket folder, in the process that forks them: removed when it ends.
_WARM_FOLDER: str | None = None


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs: not ended, not a zombie left for its parent to reap, and
    not another process that has since taken its pid (psutil compares start times)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone between the two questions
        return False


def _exit_when_gone(runner: psutil.Process) -> None:
    """Waits, on a daemon thread, for ``runner`` to end, then ends this worker at once (_end_now):
    nothing is left to report its work to, and no teardown is worth waiting for."""
    while _alive(runner):
        threading.Event().wait(_WATCH_INTERVAL_S)
    _end_now()


def _end_now() -> None:
    """Kills this worker's children (an isolated decoder, say), removes the warm workers' socket
    folder where this process holds it, and exits without any teardown."""
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    _remove_warm_folder()
    os._exit(RUNNER_GONE_EXIT_CODE)  # pylint: disable=protected-access


def _remove_warm_folder() -> None:
    if _WARM_FOLDER is not None:
        shutil.rmtree(_WARM_FOLDER, ignore_errors=True)


def _alive_pid(process_id: str) -> bool:
    try:
        return _alive(psutil.Process(int(process_id)))
    except (ValueError, psutil.Error):
        return False


def _end_with(process_id: str, program: str) -> None:
    """Starts the watch that ends this worker with the job's process ``process_id``."""
    try:
        runner = psutil.Process(int(process_id))
    except (ValueError, psutil.Error):
        sys.exit(f"{program}: the job's process {process_id!r} is not running")
    threading.Thread(target=_exit_when_gone, args=(runner,), name="runner-watch", daemon=True).start()


def _run_harness(program: str) -> None:
    warnings_to_debug_log()  # Libraries' warnings would reach the job's console through this process's stderr.
    sdk_worker_main.main([program])
    gc.freeze()


def _exit_when_closed(connection: socket.socket) -> None:
    """Ends this warm worker, with its children, once its launcher is gone (the runner killed it)."""
    while True:
        try:
            if not connection.recv(1):
                break
        except OSError:
            break
    _end_now()


def _serve_warm(program: str, runner_pid: str, socket_paths: list[str]) -> None:
    """The warm workers: one process listens on every socket first (a launcher that comes early
    waits for its worker rather than starting cold), imports once what a worker needs, then forks
    a worker a socket, and waits for them (ending them when it is ended). Forked, the workers
    share the imports' memory and cost their CPU once: on 2 cores, importing in each worker
    made the job's own start as slow as the workers' start it overlapped."""
    global _WARM_FOLDER  # pylint: disable=global-statement
    listeners = []
    for path in socket_paths:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listeners.append(listener)
    # What a cold worker imports once it unpickles the job's DoFns: the codecs and the converter.
    import beam_jobs.writing.convert_shards  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import

    workers = []
    for listener in listeners:
        pid = os.fork()
        if pid == 0:  # a worker: its own watch of the job's process (threads do not survive a fork)
            for other in listeners:
                if other is not listener:
                    other.close()
            _WARM_FOLDER = None  # the forking process removes it
            _end_with(runner_pid, program)
            _serve_one(program, listener)
            return
        workers.append(pid)
    for listener in listeners:
        listener.close()

    def end_workers(signum: int, _frame: object) -> None:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _remove_warm_folder()
        os._exit(128 + signum)  # pylint: disable=protected-access

    signal.signal(signal.SIGTERM, end_workers)
    signal.signal(signal.SIGINT, end_workers)
    for pid in workers:
        os.waitpid(pid, 0)
    _remove_warm_folder()


def _take_streams(numbers: list[int], received: list[int]) -> None:
    """Makes the launcher's standard streams this worker's, as a cold worker inherits them: its
    output then passes through whatever the runner put there (the job's console filter)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for number, fd in zip(numbers, received, strict=True):
        os.dup2(fd, number)
        os.close(fd)


def _serve_one(program: str, listener: socket.socket) -> None:
    """One warm worker: runs the harness for the one launcher that claims it, in that launcher's
    environment and folder, and tells it the exit code."""
    listener.settimeout(warm_workers.IDLE_TIMEOUT_S)
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        return  # never claimed: the launchers have started cold workers, or the run ended early
    finally:
        listener.close()
    connection.settimeout(None)
    request, streams, _, _ = socket.recv_fds(connection, 65536, len(warm_workers.STANDARD_STREAMS))
    while request and not request.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            break
        request += chunk
    if not request.endswith(b"\n"):
        return  # the launcher went before handing everything over
    handed = json.loads(request)
    _take_streams(handed["streams"], streams)
    os.chdir(handed["cwd"])
    os.environ.clear()
    os.environ.update(handed["env"])
    connection.sendall(f"{warm_workers.STARTED} {os.getpid()}\n".encode())
    threading.Thread(target=_exit_when_closed, args=(connection,), name="launcher-watch", daemon=True).start()
    code = 0
    try:
        _run_harness(program)
    except BaseException:  # reported as Python reports it, and as the exit code the launcher exits with
        traceback.print_exc()
        code = 1
    connection.sendall(f"{warm_workers.EXITED} {code}\n".encode())
    if code:
        sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Runs the SDK harness as Beam's own worker does, ended with the job's process (whose pid is
    the one argument) and exited quickly (see the module docstring)."""
    argv = sys.argv if argv is None else argv
    if len(argv) > 3 and argv[1] == "--warm":
        global _WARM_FOLDER  # pylint: disable=global-statement
        _WARM_FOLDER = os.path.dirname(argv[3])  # removed however this process ends
        if not _alive_pid(argv[2]):  # the command ended while this process imported: nothing to serve
            _remove_warm_folder()
            return
        _end_with(argv[2], argv[0])
        _serve_warm(argv[0], argv[2], argv[3:])
        return
    if len(argv) > 1:
        _end_with(argv[1], argv[0])
    _run_harness(argv[0])


if __name__ == "__main__":
    main()

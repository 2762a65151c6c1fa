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
"""

from __future__ import annotations

import gc
import os
import sys
import threading

import psutil
from apache_beam.runners.worker import sdk_worker_main

from beam_jobs.third_party_warnings import warnings_to_debug_log

__all__ = ["RUNNER_GONE_EXIT_CODE", "main"]

# How often a worker looks for the job's process, and its exit code once that process is gone.
_WATCH_INTERVAL_S = 0.5
RUNNER_GONE_EXIT_CODE = 3


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs: not ended, not a zombie left for its parent to reap, and
    not another process that has since taken its pid (psutil compares start times)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone between the two questions
        return False


def _exit_when_gone(runner: psutil.Process) -> None:
    """Waits, on a daemon thread, for ``runner`` to end, then kills this worker's children and ends
    it at once: nothing is left to report its work to, and no teardown is worth waiting for."""
    while _alive(runner):
        threading.Event().wait(_WATCH_INTERVAL_S)
    for child in psutil.Process().children(recursive=True):  # an isolated decoder, say
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(RUNNER_GONE_EXIT_CODE)  # pylint: disable=protected-access


def main(argv: list[str] | None = None) -> None:
    """Runs the SDK harness as Beam's own worker does, ended with the job's process (whose pid is
    the one argument) and exited quickly (see the module docstring)."""
    argv = sys.argv if argv is None else argv
    if len(argv) > 1:
        try:
            runner = psutil.Process(int(argv[1]))
        except (ValueError, psutil.Error):
            sys.exit(f"{argv[0]}: the job's process {argv[1]!r} is not running")
        threading.Thread(target=_exit_when_gone, args=(runner,), name="runner-watch", daemon=True).start()
    warnings_to_debug_log()  # Libraries' warnings would reach the job's console through this process's stderr.
    sdk_worker_main.main(argv[:1])
    gc.freeze()


if __name__ == "__main__":
    main()

"""The local runner's worker process: Beam's SDK harness, with a quick exit once it is done.

Beam starts each local worker as ``python -m apache_beam.runners.worker.sdk_worker_main``, and at
the end of a run closes them one after another, waiting for each process to exit. Such a worker
exits slowly: the interpreter's last garbage collections walk a heap of Beam, gRPC, numpy and the
codecs (measured on 2 cores: 1.1-1.3 s a worker after converting photos, so 2.5 s of a 15 s run
of 8000 photos spent after the last shard was written; 0.45 s a worker even for a pipeline of 100
integers). Once the harness returns, every bundle has finished and been reported and the DoFns'
teardown has run, so nothing in that heap needs collecting: ``gc.freeze()`` moves it out of the
collector's sight, and the exit that follows runs as usual (threads joined, exit handlers run,
multiprocessing's semaphores removed) without the walk (0.04 s a worker).

A harness that fails raises, and its process then exits as Python's does (with the traceback and
a non-zero code), so that the runner sees the failure as before.
"""

from __future__ import annotations

import gc
import sys

from apache_beam.runners.worker import sdk_worker_main


def main() -> None:
    """Runs the SDK harness as Beam's own worker does, then readies a quick exit (see the module docstring)."""
    sdk_worker_main.main(sys.argv)
    gc.freeze()


if __name__ == "__main__":
    main()

"""The local runner: Beam's FnApiRunner on every core, in worker processes or in this process.

Beam's multi-processing mode starts an SDK worker process per core; each imports Beam and
receives its stages' elements over gRPC. Its own process (Beam's ``in_memory`` mode) saves those
starts, but its threads share one GIL: converting is codec work that releases the GIL, yet the
Python around each image (reading, framing, Beam's data plane and counters) held it for the
whole of a run in a profile. Measured on 2 cores (benchmarks/conversion.py, one run, medians of
3, 2026-12-03): 8000 photos, worker processes 604 images/s against 488 in one process; 200
photos, 35 against 50. So a worker process per core is the default, the large jobs' choice, and one
process only where there is one core to run on; ``--direct_running_mode in_memory`` is the faster
choice for small jobs (a notebook's, a test's).

Worker processes run local_worker.py, Beam's own harness with a quick exit (Beam closes its
workers one after another, and each would otherwise spend a second collecting its heap), which
also ends with the job's process, however that process ended.

Which mode and how many threads never change the bytes: a shard's records are written in plan
order whatever converts them (convert_shards.py).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from beam_jobs.warm_workers import current as current_warm_workers
from beam_jobs.warm_workers import launcher_command

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

__all__ = [
    "BEAM_WORKER_MODULE",
    "IN_PROCESS",
    "QUIET_LOGGERS",
    "THREADS_PER_CORE",
    "WORKER_MODULE",
    "WORKER_PROCESSES",
    "LocalParallelism",
    "available_cores",
    "local_parallelism",
    "local_runner",
    "worker_command",
]

IN_PROCESS = "in_memory"  # Beam's name for the FnApiRunner mode that runs bundles in this process
WORKER_PROCESSES = "multi_processing"
# Converter threads per core a process serves: while one thread reads, frames and writes, the
# others keep the core in the codecs, and a worker that finishes its shards early does not leave
# its core idle. Measured, 8000 photos to 224 px on 2 cores, 2 workers (medians of 5 interleaved
# runs, 2026-12-02): two threads a core 16.3 s, three 14.4 s, four 15.5 s (3 runs), one 15.2 s (2 runs).
# Since converters take chunks of inputs (convert_shards.CONVERT_CHUNK), one, two and three
# threads measured alike (11.33 to 11.44 s, 2 runs each, 2026-12-07); three are kept.
THREADS_PER_CORE = 3
# Kept at WARNING (sdk_worker_main) or INFO (the HTTP clients) even with --log_level DEBUG, in the
# job's process and its workers alike: their DEBUG lines print the pipeline options and each
# request's signed headers, credentials included (an x-amz-security-token), and DEBUG output is
# what users paste into bug reports.
QUIET_LOGGERS = {
    "apache_beam.runners.worker.sdk_worker_main": "WARNING",
    "botocore": "INFO",
    "boto3": "INFO",
    "s3transfer": "INFO",
    "urllib3": "INFO",
    "google.auth": "INFO",
}


@dataclass(frozen=True)
class LocalParallelism:
    """How the local runner spreads a job: Beam's ``direct_running_mode``, its number of workers
    (``direct_num_workers``), and the converter threads of each worker (ConvertShardFn)."""

    mode: str
    workers: int
    convert_threads: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.convert_threads < 1:
            raise ValueError(
                f"workers and convert_threads must be at least 1 (got {self.workers} and {self.convert_threads})"
            )
        if self.mode == IN_PROCESS and self.workers != 1:
            raise ValueError(f"the {IN_PROCESS} mode runs one worker (got {self.workers})")


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or taskset's limit),
    not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def local_parallelism(cores: int, *, mode: str | None = None, workers: int | None = None) -> LocalParallelism:
    """The local runner's mode, workers and threads on ``cores`` cores: pure, so that the policy
    is tested on any core count. ``mode`` and ``workers`` are what the user gave with
    ``--direct_running_mode`` and ``--direct_num_workers`` (None: not given; 0 workers: Beam's
    "all cores", a worker per core); what they give is kept, and each worker converts on
    THREADS_PER_CORE threads for each core it has.
    """
    cores = max(1, cores)
    if workers is not None and workers < 0:
        raise ValueError(f"--direct_num_workers must be 0 (all cores) or more (got {workers})")
    if mode is None:
        if workers is None:
            workers = cores  # a worker process per core (see the docstring)
        mode = IN_PROCESS if workers == 1 else WORKER_PROCESSES
    if mode == IN_PROCESS:
        workers = 1
    elif not workers:
        workers = cores
    return LocalParallelism(mode, workers, THREADS_PER_CORE * math.ceil(cores / workers))


def local_runner(
    options: PipelineOptions, runner_args: Sequence[str], *, log_level: str
) -> tuple[FnApiRunner | None, LocalParallelism | None]:
    """With no --runner: Beam's FnApiRunner on all local cores, and how it spreads the work
    (local_parallelism); else (None, None).

    Beam's DirectRunner would first try to download the Prism runner binary, which fails offline.
    The runner is built here rather than named with --runner=FnApiRunner because, named, it hands
    its worker processes no pipeline options: they would then log at INFO whatever was asked,
    and their filesystems would lack the options they need (an S3 endpoint and keys, say).
    """
    # Imported here: the module's policy is Beam-free, and so are the tests of it.
    from apache_beam.options.pipeline_options import (  # pylint: disable=import-outside-toplevel
        DirectOptions,
        StandardOptions,
        WorkerOptions,
    )
    from apache_beam.portability.api import beam_provision_api_pb2  # pylint: disable=import-outside-toplevel
    from apache_beam.runners.portability.fn_api_runner import fn_runner  # pylint: disable=import-outside-toplevel
    from apache_beam.runners.portability.portable_runner import JobServiceHandle  # pylint: disable=import-outside-toplevel

    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        return None, None
    direct = options.view_as(DirectOptions)
    given = " ".join(runner_args)  # which of Beam's options the user set (their values are in options)
    parallelism = local_parallelism(
        available_cores(),
        mode=direct.direct_running_mode if "--direct_running_mode" in given else None,
        workers=direct.direct_num_workers if "--direct_num_workers" in given else None,
    )
    direct.direct_running_mode = parallelism.mode
    direct.direct_num_workers = parallelism.workers
    # Workers log our per-shard progress; Beam's own INFO chatter from every worker would bury it.
    worker = options.view_as(WorkerOptions)
    if "--default_sdk_harness_log_level" not in given:
        worker.default_sdk_harness_log_level = log_level
    if "--sdk_harness_log_level_overrides" not in given:
        overrides = {
            "beam_jobs": "INFO" if log_level != "DEBUG" else "DEBUG",
            "beam_jobs.details": "INFO" if log_level in ("INFO", "DEBUG") else log_level,
        }
        # sdk_worker_main logs every pipeline option (keys included) when a worker starts, and the
        # runner relays that line; botocore at DEBUG logs request headers (a session token).
        overrides.update(
            {
                name: logging.getLevelName(max(getattr(logging, log_level, logging.WARNING), getattr(logging, quiet)))
                for name, quiet in QUIET_LOGGERS.items()
            }
        )
        if log_level != "DEBUG":
            # These two log each failed bundle's traceback, twice; the failure is what ends the
            # run, and main() reports it as one line (--log_level DEBUG shows them).
            overrides.update(
                {"apache_beam.runners.common": "CRITICAL", "apache_beam.runners.worker.sdk_worker": "CRITICAL"}
            )
        worker.sdk_harness_log_level_overrides = overrides
    # Beam's own options only (the spec's runner_args hold no flag of the job's): workers do not
    # know the job's flags, and would warn about each.
    beam_options = options.get_all_options(drop_default=True)
    provision = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(
            retrieval_token="unused-retrieval-token",
            pipeline_options=JobServiceHandle.encode_pipeline_options(beam_options),
        )
    )
    return _with_quick_exit_workers(fn_runner.FnApiRunner)(provision_info=provision), parallelism


BEAM_WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"
WORKER_MODULE = "beam_jobs.local_worker"


def worker_command(beam_command: str, runner_pid: int, warm_folder: str | None = None) -> str:
    """The command line that starts a local worker in place of Beam's ``beam_command``: the same
    interpreter, running local_worker.py, which ends with the process ``runner_pid`` and exits
    quickly once its harness is done; where warm workers wait in ``warm_folder``, the launcher
    that claims one of them (warm_workers.py)."""
    interpreter = beam_command.split(f" -m {BEAM_WORKER_MODULE}")[0]
    if warm_folder is not None:
        return launcher_command(interpreter, runner_pid, warm_folder)
    return f"{interpreter} -m {WORKER_MODULE} {runner_pid}"


def _with_quick_exit_workers(runner_class: type) -> type:
    """``runner_class`` (Beam's FnApiRunner), starting its worker processes with local_worker.py.

    The FnApiRunner's multi-processing mode names Beam's worker module in the pipeline's
    environment (a SUBPROCESS_SDK environment whose payload is the command line) just before it
    runs the pipeline's Runner API proto; this rewrites that payload in the proto, the runner's
    public input, rather than any of the runner's private state.
    """
    from apache_beam.portability import python_urns  # pylint: disable=import-outside-toplevel

    class QuickExitWorkersRunner(runner_class):
        def run_via_runner_api(self, pipeline_proto, options):  # noqa: ANN001, ANN202
            for environment in pipeline_proto.components.environments.values():
                command = environment.payload.decode("utf-8") if environment.urn == python_urns.SUBPROCESS_SDK else ""
                if command.endswith(f" -m {BEAM_WORKER_MODULE}"):
                    warm = current_warm_workers()
                    folder = None if warm is None else warm.folder
                    environment.payload = worker_command(command, os.getpid(), folder).encode("utf-8")
            return super().run_via_runner_api(pipeline_proto, options)

    return QuickExitWorkersRunner

"""A run's lifecycle: pre-flight checks, the lock, building and running the pipeline, watching its
progress, interruption, the commit's outcome. ``run_spec(spec, options)`` is the one place.

Beneath the entry points (the command line, ``beam_jobs.convert``): it takes the spec they built
and Beam's options, and returns the dataset_info.json committed (or the plan written). What the
console prints of it (the summary, the one error line) is the command line's (command_line/job_main.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter

from beam_jobs.convert_images import ConvertImages, RunContext
from beam_jobs.interruption import (
    InterruptedState,
    child_pids,
    interrupt_caught,
    on_stuck,
    stop_child_processes,
)
from beam_jobs.local_runner import local_runner
from beam_jobs.paths import redact
from beam_jobs.preflight import (
    PROGRESS_FILE,
    SIDECAR,
    TEMP_FILE,
    check_endpoint_reachable,
    check_inputs_exist,
    check_output_outside_input,
    make_output_dir,
    remove_created,
    start_run,
    with_dataset_defaults,
)
from beam_jobs.spec import ConversionSpec
from beam_jobs.storage import delete_exactly, list_folder
from beam_jobs.warm_workers import current as current_warm_workers
from beam_jobs.writing.convert_shards import METRICS_NAMESPACE
from beam_jobs.writing.finalize import DATASET_INFO, DEAD_LETTERS_FILE, PLAN_FILE
from beam_jobs.writing.run_folders import RUN_SETTINGS_FILE, SHARDS_DIR, forget_run_settings, run_dir
from beam_jobs.writing.run_lock import acquire_output_lock, release_output_lock

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.runner import PipelineResult

__all__ = ["QuietConsole", "RunConsole", "ShownRun", "run_spec"]

_LOG = logging.getLogger("beam_jobs")
# Per-shard lines, counters and the like: shown with --log_level INFO or DEBUG. By default the
# console shows the plan, a progress bar and the final table instead (see StagingWatcher).
_DETAILS = logging.getLogger("beam_jobs.details")


class ShownRun(Protocol):
    """One run as the console shows it while its pipeline runs."""

    def submitted(self, result: PipelineResult) -> None:
        """The runner took the job (a cluster's runner has a UI to follow it in)."""

    def finished(self) -> None:
        """The pipeline ran to its end."""

    def mute(self) -> None:
        """Interrupted: nothing more from the workers."""


class RunConsole(Protocol):
    """What a run tells whoever launched it. The command line's terminal is one
    (command_line/run_console.py); a run given none shows nothing (QuietConsole)."""

    def stuck(self, signum: int, state: InterruptedState | None) -> None:
        """An interrupt never reached the run's cleanup: the run was ended by the watchdog."""

    def showing(self, run_id: str | None) -> contextlib.AbstractContextManager[ShownRun]:
        """The console's view while the pipeline runs."""


class _Unshown:
    def submitted(self, result: PipelineResult) -> None:
        pass

    def finished(self) -> None:
        pass

    def mute(self) -> None:
        pass


class QuietConsole:
    """A RunConsole that shows nothing: for runs driven by code that reports on its own."""

    def stuck(self, signum: int, state: InterruptedState | None) -> None:
        """Says nothing: the caller hears of the interrupt by its exception."""

    @contextlib.contextmanager
    def showing(self, run_id: str | None) -> Iterator[ShownRun]:
        """Shows nothing while the pipeline runs."""
        yield _Unshown()


def _abandon(
    output_dir: str, lock: str, created: list[str], run_id: str | None = None, spare: frozenset[int] = frozenset()
) -> None:
    """What an interrupted run leaves, when the interrupt never reached run()'s own cleanup."""
    _clean_up_interrupted(output_dir, run_id, spare)
    for folder in [output_dir] + ([] if run_id is None else [run_dir(output_dir, run_id)]):
        try:
            names = {m.path.rsplit("/", 1)[-1]: m.path for m in list_folder(folder)}
            delete_exactly([path for name, path in names.items() if PROGRESS_FILE.match(name)])
        except Exception:  # The progress file is hidden and small; the lock matters more.
            pass
    release_output_lock(lock)
    remove_created(created)


def _clean_up_interrupted(output_dir: str, run_id: str | None = None, spare: frozenset[int] = frozenset()) -> None:
    """After Ctrl-C or SIGTERM: ends the local workers, then removes the temp files they left.

    The workers die with the signal when it reached their process group (a terminal, `timeout`),
    or live on writing when it reached this process only (Docker, Kubernetes); either way a shard
    half written stays under a temp name. While this run holds the lock no other run writes
    there, so every temp file in the folder (and in the run's own) is a killed writer's. The run
    folder's complete shards stay for --resume.
    """
    # The runner's threads that wait on each worker report its death as an uncaught exception;
    # termination.sigterm_as_interrupt's hook already logs those at DEBUG once interrupted.
    stop_child_processes(spare=spare)  # the processes that were the caller's before the run are not ended
    for folder in [output_dir] + ([] if run_id is None else [run_dir(output_dir, run_id)]):
        try:
            leftovers = [m.path for m in list_folder(folder) if TEMP_FILE.match(m.path.rsplit("/", 1)[-1])]
            delete_exactly(leftovers)
        except Exception as error:  # The interrupt is what the user must hear about; a --resume removes them.
            _LOG.warning("could not remove the temp files in %s: %s", redact(folder), error)


def run_spec(spec: ConversionSpec, options: PipelineOptions, console: RunConsole | None = None) -> dict:
    """Runs the conversion ``spec`` describes with Beam's ``options``, and returns the
    dataset_info.json it committed (with ``plan_only``, the plan.json it wrote).

    Raises what failed the run, after removing what it wrote; an interrupt (Ctrl-C, SIGTERM as
    termination.Terminated) is raised with ``state``, what the run left (InterruptedState).
    ``console`` shows the run as it goes (the command line passes its terminal's).
    """
    console = console if console is not None else QuietConsole()
    warm = current_warm_workers()
    # The caller's own child processes: never the run's to end (the warm workers started for this
    # run by the command line are the run's).
    spare = child_pids() - (warm.pids if warm is not None else frozenset())
    # The job's own filesystem calls (probes, finalize) need the same options as the workers'
    # (S3 endpoint and keys, GCP project); Beam only hands them to its own transforms.
    FileSystems.set_options(options)
    check_endpoint_reachable(options, [spec.source.where, spec.output_dir])
    check_inputs_exist(spec)
    check_output_outside_input(spec)
    output_dir = spec.output_dir
    created = make_output_dir(output_dir)
    lock = None
    run = RunContext(run_id=None, expected=None)
    info_before = info_stamp(output_dir)

    def state() -> InterruptedState:
        return _interrupted_state(output_dir, run.run_id, info_before)

    try:
        lock = acquire_output_lock(output_dir)
        on_stuck(lambda signum: _abandon(output_dir, lock, created, run.run_id, spare))
        on_stuck(lambda signum: console.stuck(signum, state()))
        spec = with_dataset_defaults(spec)
        run = start_run(spec)
        runner, parallelism = local_runner(options, spec.runner_args, log_level=spec.log_level)
        if parallelism is not None:
            run = RunContext(run.run_id, run.expected, run.change_kind, convert_threads=parallelism.convert_threads)
        _DETAILS.info("converting %s into %s", redact(spec.source.where), redact(output_dir))
        pipeline = beam.Pipeline(runner=runner, options=options)
        _ = pipeline | "ConvertImages" >> ConvertImages(spec, run=run)
        result = _run_watched(pipeline, run, console)
    except BaseException as error:
        _undo(error, spec, run, lock, created, spare)
        if isinstance(error, KeyboardInterrupt):
            try:
                error.state = state()  # type: ignore[attr-defined]  # what main() reports, read before the line is printed
            except Exception:  # The line then says what holds in every case.
                pass
        raise
    assert lock is not None  # acquired before the pipeline ran
    return _outcome(spec, run, lock, result, state)


def _run_watched(pipeline: beam.Pipeline, run: RunContext, console: RunConsole) -> PipelineResult:
    """Runs the pipeline to its end while the console shows it; an interrupt that Beam re-raised
    as a step's failure is raised as the interrupt it was."""
    with console.showing(run.run_id) as shown:
        result = None
        try:
            result = pipeline.run()
            shown.submitted(result)
            result.wait_until_finish()
            shown.finished()
            return result
        except KeyboardInterrupt:
            interrupt_caught()
            shown.mute()
            _cancel_on_the_runner(result)
            raise
        except Exception as error:
            interrupt = _interrupt_within(error)
            if interrupt is None:
                raise
            interrupt_caught()
            shown.mute()
            _cancel_on_the_runner(result)
            raise interrupt from None


def _cancel_on_the_runner(result: PipelineResult | None, timeout_s: float = 10.0) -> None:
    """Cancels the job of an interrupted driver where a job service runs it (Spark's, Flink's, the
    portable one): otherwise it ran on, and could still commit a dataset, after the driver had
    reported the interrupt. The local runner's result only comes once its job is over (None here);
    a Dataflow job outlives its launcher by design (its console cancels it). On a thread, waited
    for ``timeout_s`` at most: a job service that is gone must not hold up the interrupt's cleanup."""
    from apache_beam.runners.portability.portable_runner import (  # pylint: disable=import-outside-toplevel
        PipelineResult as JobServiceResult,
    )

    if not isinstance(result, JobServiceResult):
        return

    def cancel() -> None:
        try:
            result.cancel()
        except Exception as error:  # pylint: disable=broad-exception-caught  # gone, or already ended
            _DETAILS.info("the runner did not take the cancel: %s", error)

    canceller = threading.Thread(target=cancel, name="cancel-on-runner", daemon=True)
    canceller.start()
    canceller.join(timeout_s)


def _undo(
    error: BaseException,
    spec: ConversionSpec,
    run: RunContext,
    lock: str | None,
    created: list[str],
    spare: frozenset[int],
) -> None:
    """What a failed or interrupted run removes: its workers, their temp files, the lock, its run
    folder when it staged nothing there, and the folders it created."""
    if isinstance(error, KeyboardInterrupt):
        interrupt_caught()
    output_dir = spec.output_dir
    if lock is not None:
        # Interrupted or failed (a full disk, a bad step): the workers a failing runner leaves
        # may still be writing; once they are ended, every temp file is a dead writer's.
        _clean_up_interrupted(output_dir, run.run_id, spare)
        release_output_lock(lock)
    if run.run_id is not None:
        folder = run_dir(output_dir, run.run_id)
        continues_a_dataset = run.expected is not None and run.expected.manifest is not None
        if not (isinstance(error, KeyboardInterrupt) and continues_a_dataset):
            _forget_settings_if_nothing_staged(folder)
        remove_created([folder, FileSystems.join(output_dir, SHARDS_DIR)])
    remove_created(created)


def _outcome(
    spec: ConversionSpec,
    run: RunContext,
    lock: str,
    result: PipelineResult,
    state: Callable[[], InterruptedState],
) -> dict:
    """After the pipeline: the lock released, the counters logged, and what the run wrote read back."""
    output_dir = spec.output_dir
    released = False
    try:
        release_output_lock(lock)
        released = True
        _log_counters(result)
        written = FileSystems.join(output_dir, PLAN_FILE if spec.mode.plan_only else DATASET_INFO)
        with FileSystems.open(written) as handle:
            info = json.loads(handle.read().decode("utf-8"))
    except KeyboardInterrupt as interrupt:  # The run is over: its line says what it left.
        interrupt_caught()
        if not released:
            release_output_lock(lock)
        with contextlib.suppress(Exception):
            finished = InterruptedState(completed=True, plan_only=True) if spec.mode.plan_only else state()
            interrupt.state = finished  # type: ignore[attr-defined]
        raise
    expected = run.expected
    if spec.mode.append and expected is not None and info.get("version") == expected.version and run.run_id:
        # finalize found no new example and committed nothing: the new inputs, if any, are dead letters
        folder = run_dir(output_dir, run.run_id)
        info["nothing_appended"] = _dead_letter_reasons(FileSystems.join(folder, DEAD_LETTERS_FILE))
        forget_run_settings(output_dir, run.run_id)  # the run is over: nothing to resume
        if not info["nothing_appended"]["by_reason"]:
            # No shard and an empty dead_letters.jsonl: nothing will read the folder.
            if _remove_if_only(folder, {DEAD_LETTERS_FILE}) and "://" not in folder:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
    return info


def _forget_settings_if_nothing_staged(folder: str) -> None:
    """Deletes the settings' record of a run that failed, or was interrupted in a folder holding
    no dataset, when it staged no shard: there is no work to continue and no dataset whose
    settings a --resume could take instead (the interrupted line says to rerun the same command),
    and the folder, left empty, goes too. An interrupt over a dataset keeps it, as a kill does:
    a --resume then takes the interrupted run's settings, not the dataset's (run_folders.py)."""
    try:
        names = {m.path.rsplit("/", 1)[-1]: m.path for m in list_folder(folder)}
        if RUN_SETTINGS_FILE in names and not any(SIDECAR.match(name) for name in names):
            delete_exactly([names[RUN_SETTINGS_FILE]])
    except Exception:  # pylint: disable=broad-exception-caught  # gone, or unreadable: gc collects it
        pass


def _remove_if_only(folder: str, names: set[str]) -> bool:
    """Deletes the files of a run folder that holds only files of these ``names``; False, and
    nothing deleted, when it holds anything else (or cannot be listed: left in place, gc
    collects it as an uncommitted run's)."""
    try:
        files = [m.path for m in list_folder(folder)]
        if not {path.rsplit("/", 1)[-1] for path in files} <= names:
            return False
        delete_exactly(files)
        return True
    except Exception:  # pylint: disable=broad-exception-caught
        return False


def _dead_letter_reasons(path: str) -> dict:
    """{"file": path, "by_reason": {reason: count}} of a run's dead_letters.jsonl ({} by_reason when it has none)."""
    by_reason: dict[str, int] = {}
    with contextlib.suppress(Exception):  # none written: no dead letter
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            for line in handle.read().decode("utf-8").splitlines():
                if line.strip():
                    reason = json.loads(line).get("reason", "unknown")
                    by_reason[reason] = by_reason.get(reason, 0) + 1
    return {"file": path, "by_reason": by_reason}


def _interrupt_within(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt (Ctrl-C, or SIGTERM's Terminated) that ``error`` stands for, if any: in its
    own process the runner runs the DoFns on the main thread, where the signal's exception lands,
    and Beam re-raises it as a RuntimeError naming the step, with the interrupt as its context."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _log_counters(result: PipelineResult) -> None:
    """Logs the job's Beam counters, the same figures a cluster runner's UI shows."""
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    except Exception:  # Some runners cannot report metrics; the job's outputs are what matter.
        return
    totals: dict[str, int] = {}
    for counter in counters:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + (counter.committed or 0)
    if totals:
        _DETAILS.info("counters: %s", ", ".join(f"{name}={value}" for name, value in sorted(totals.items())))


def info_stamp(output_dir: str) -> tuple | None:
    """(size, modification time) of the dataset_info.json there, or None: tells whether a run wrote one."""
    try:
        found = [m for m in list_folder(output_dir) if m.path.rsplit("/", 1)[-1] == DATASET_INFO]
    except Exception:  # The folder is gone (removed as created by this run) or unreadable.
        return None
    meta = found[0] if found else None
    return None if meta is None else (meta.size_in_bytes, meta.last_updated_in_seconds)


def _interrupted_state(output_dir: str, run_id: str | None, info_before: tuple | None) -> InterruptedState:
    """Reads the folder after an interrupt: this run's staged sidecars, and whether it had finished."""
    after = info_stamp(output_dir)
    completed = after is not None and after != info_before
    if run_id is None:
        return InterruptedState(completed=completed)
    staged = 0
    try:
        sidecars = [
            m.path for m in list_folder(run_dir(output_dir, run_id)) if SIDECAR.match(m.path.rsplit("/", 1)[-1])
        ]
    except Exception:  # Gone: nothing of this run is there.
        sidecars = []
    for path in sidecars:
        try:
            with FileSystems.open(path) as handle:
                staged += json.loads(handle.read().decode("utf-8")).get("run_id") == run_id
        except (OSError, ValueError, AttributeError):  # Half written or removed meanwhile: not staged.
            continue
    return InterruptedState(staged=staged, completed=completed)

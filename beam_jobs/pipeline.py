"""The conversion pipeline, ``run(argv)`` and the command-line entry point."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, TextIO

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter

from beam_jobs.command_line.arguments import (
    PROG,
    UsageError,
    absolute_uri,
    help_parser,
    parse_job_arguments,
    run_settings,
)
from beam_jobs.command_line.console import ConsoleFilter, hide_worker_tracebacks
from beam_jobs.command_line.job_logging import LOG_PLAN_STEP, configure_job_logging, info_stamp
from beam_jobs.command_line.progress import StagingWatcher
from beam_jobs.command_line.progress_display import LineProgress, TtyProgress
from beam_jobs.command_line.run_summary import next_steps_lines, outputs_lines, split_table
from beam_jobs.command_line.runner_ui import watch_hint
from beam_jobs.command_line.termination import (
    InterruptedState,
    Terminated,
    child_pids,
    interrupt_caught,
    on_stuck,
    sigterm_as_interrupt,
    state_outside_the_run,
    stop_child_processes,
)
from beam_jobs.command_line.termination import interrupted_line as _interrupted_line
from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError, JobError
from beam_jobs.imaging.reading import READ_TIMEOUT_S, read_source, source_digests, source_state
from beam_jobs.listing.coco import ListCoco
from beam_jobs.listing.discover import IGNORED, LISTING, ListInputList, ListRows, ListTree
from beam_jobs.listing.policy import ignored_note
from beam_jobs.local_runner import local_runner
from beam_jobs.paths import redact
from beam_jobs.planning.rules import (
    DEFAULT_SPLIT_RULE,
    DEFAULT_TARGET_SHARD_MB,
    estimate_example_bytes,
    label_lineage,
    with_label_map,
)
from beam_jobs.planning.transforms import PLAN_CHANGES, PLAN_DEAD_LETTERS, PLAN_SUMMARY, PlanShards, SourceChangesFn
from beam_jobs.preflight import (
    PROGRESS_FILE,
    SIDECAR,
    TEMP_FILE,
    check_endpoint_reachable,
    check_inputs_exist,
    check_output_dir,
    check_output_outside_input,
    check_plan_file,
    fingerprint_with_layout_of,
    make_output_dir,
    remove_created,
)
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import delete_exactly, list_folder
from beam_jobs.writing.append import (
    WHOLE_DATASET_WARNING,
    SourceChangesError,
    annotation_kinds_of,
    check_source_changes,
    held_content_keys,
    held_sidecars,
    read_held_inputs,
)
from beam_jobs.writing.commit import CommitConflictError, Current, read_current
from beam_jobs.writing.convert_shards import (
    CONTENT_KEYS,
    CONVERT_THREADS,
    DEAD_LETTERS,
    METRICS_NAMESPACE,
    ConvertShardFn,
)
from beam_jobs.writing.finalize import (
    DATASET_INFO,
    DEAD_LETTERS_FILE,
    DROPPED_REASONS,
    PLAN_FILE,
    TooManyBadInputsError,
    content_duplicate_groups,
    dead_letter_part,
    finalize_outputs,
    plan_line,
    plan_warning_lines,
    run_fingerprint,
    write_dead_letter_part,
    write_plan,
)
from beam_jobs.writing.run_folders import SHARDS_DIR, new_run_name, run_dir, run_made_for
from beam_jobs.writing.run_lock import OutputLockedError, acquire_output_lock, release_output_lock
from beam_jobs.writing.shard_progress import write_progress_plan

if TYPE_CHECKING:
    from apache_beam.runners.runner import PipelineResult

__all__ = ["ConvertImages", "main", "run"]

_LOG = logging.getLogger("beam_jobs")
# Per-shard lines, counters and the like: shown with --log_level INFO or DEBUG. By default the
# console shows the plan, a progress bar and the final table instead (see StagingWatcher).
_DETAILS = logging.getLogger("beam_jobs.details")


def _with_content_hash(item: InputFile | DeadLetter, *, max_file_bytes: int) -> InputFile | DeadLetter:
    """For --dedup=content: the sha256 of each input's bytes, before planning (unreadable inputs
    keep None and are dead-lettered by the conversion as usual)."""
    if not isinstance(item, InputFile):
        return item
    try:
        data = read_source(item, max_file_bytes)
    except BadInputError:
        return item
    return dataclasses.replace(item, content_sha256=hashlib.sha256(data).hexdigest())


def _duplicate_groups(keyed: tuple[str, Iterable[tuple[str, str]]]) -> list[dict]:
    return content_duplicate_groups([keyed])


def _log_plan(
    summary: dict, plan_parts: list[dict], ignored: list | tuple = (), *, output_dir: str, run_id: str | None
) -> dict:
    """Logs the plan's line, and leaves it with the totals for the launching process's watcher.
    ``ignored`` holds (Ignored kind, count) for the entries the listing left out on purpose."""
    by_reason: dict[str, int] = {}
    for part in plan_parts:
        for reason, count in part["by_reason"].items():
            by_reason[reason] = by_reason.get(reason, 0) + count
    line = "\n".join([plan_line(summary, by_reason) + ignored_note(dict(ignored)), *plan_warning_lines(summary)])
    _DETAILS.info("%s", line)
    if run_id is not None:
        write_progress_plan(output_dir, run_id, line=line, summary=summary)
    return summary


class ConvertImages(beam.PTransform):
    """Lists, plans, converts and finalises: the whole job as one transform.

    Applied to a pipeline, it lists ``input_root`` (a class-per-folder tree) or ``input_list`` (a
    CSV/JSONL file). Applied to a PCollection of rows, dicts with ``uri`` and ``label`` and
    optionally ``split`` (read from BigQuery, say), it converts those: relative uris are relative
    to ``rows_root``, which is also what each example's ``image/filename`` is relative to, and a
    bad row is a dead letter like a bad line of an input list. It returns a PCollection of one
    dict, the ``dataset_info.json`` it committed into ``output_dir``.

    With ``plan_only`` it stops after planning and writes plan.json instead of converting.
    """

    def __init__(
        self,
        *,
        output_dir: str,
        input_root: str | None = None,
        input_list: str | None = None,
        rows_root: str | None = None,
        image_config: ImageConfig | None = None,
        split_fractions: dict[str, float] | None = None,
        num_shards: int | None = None,
        target_shard_bytes: int = DEFAULT_TARGET_SHARD_MB * 2**20,
        max_bad_fraction: float = 0.01,
        settings: dict | None = None,
        dedup: str = "path",
        resume: bool = False,
        allow_outside_root: bool = False,
        tree_layout: str = "auto",
        plan_only: bool = False,
        run_id: str | None = None,
        split_rule: str = DEFAULT_SPLIT_RULE,
        expected: Current | None = None,
        change_kind: str = "create",
        keep_versions: int = 2,
        changed_sources: str = "refuse",
        convert_threads: int = CONVERT_THREADS,
        coco_files: list[tuple[str | None, str]] | None = None,
        keep_unannotated: bool = True,
        coco_masks: bool = False,
        relabel: str = "keep",
    ) -> None:
        super().__init__()
        # COCO annotation files (with their splits): the images are named there, under input_root.
        self._coco_files = coco_files
        self._keep_unannotated = keep_unannotated
        self._coco_masks = coco_masks
        if sum(source is not None for source in (input_root, input_list, rows_root)) != 1:
            raise ValueError(
                "ConvertImages takes exactly one of input_root (a tree), input_list (a CSV/JSONL "
                "file) and rows_root (applied to a PCollection of rows)"
            )
        self._convert_threads = convert_threads  # images each worker converts at once (ConvertShardFn)
        self._changed_sources = changed_sources  # --append: what to do with changed or removed sources
        # The run's name: its folder under shards/, and the progress file the launching process
        # watches there (None: a plan only, which converts nothing).
        # Used as a library transform (not through run()), it names its own run, and starts from
        # whatever version is current when the pipeline is built.
        self._run_id = run_id if run_id is not None or plan_only else new_run_name()
        self._expected = expected if expected is not None or plan_only else read_current(output_dir)
        self._change_kind = (
            "overwrite"
            if change_kind == "create" and self._expected is not None and self._expected.manifest is not None
            else change_kind
        )
        if relabel == "sorted" and self._change_kind == "append":
            raise ValueError(
                "relabel='sorted' renumbers label ids, and an append keeps the current version's shards with "
                "their ids: rebuild with overwrite and relabel='sorted' instead"
            )
        # "keep": the label ids of the current version (and of those a rollback left) carry on; "sorted":
        # this version numbers its labels by their sorted names, as a first version does.
        self._relabel = relabel
        self._keep_versions = keep_versions
        self._input_root = input_root
        self._input_list = input_list
        self._rows_root = None if rows_root is None else absolute_uri(rows_root)
        self._output_dir = output_dir
        self._config = image_config if image_config is not None else ImageConfig()
        self._split_fractions = split_fractions
        self._split_rule = split_rule
        self._num_shards = num_shards
        self._target_shard_bytes = target_shard_bytes
        self._max_bad_fraction = max_bad_fraction
        self._settings = (
            settings
            if settings is not None
            else run_settings(
                split_fractions=split_fractions,
                split_rule=split_rule,
                num_shards=num_shards or 0,
                target_shard_mb=target_shard_bytes / 2**20,
                dedup=dedup,
            )
        )
        self._dedup = dedup
        self._resume = resume
        self._allow_outside_root = allow_outside_root
        self._tree_layout = tree_layout
        self._plan_only = plan_only

    def expand(self, pipeline: beam.pvalue.PBegin | beam.PCollection) -> beam.PCollection:
        """Wires the job's steps, from the listing to the one commit: its one element is the dataset_info.json
        committed (with ``plan_only``, the plan.json written)."""
        config = self._config
        output_dir = self._output_dir
        # Everything the conversion writes goes into the run's own folder (run_folders.py).
        folder = output_dir if self._run_id is None else run_dir(output_dir, self._run_id)
        if self._coco_files:
            assert self._input_root is not None, "COCO files name their images under input_root"
            listed = {
                LISTING: pipeline
                | "ListCoco"
                >> ListCoco(
                    self._coco_files,
                    root=self._input_root,
                    keep_empty=self._keep_unannotated,
                    allow_outside_root=self._allow_outside_root,
                    masks=self._coco_masks,
                ),
                IGNORED: pipeline | "NothingIgnored" >> beam.Create([]),
            }
        elif self._input_root is not None:
            listed = pipeline | "ListTree" >> ListTree(
                self._input_root, allow_outside_root=self._allow_outside_root, with_ignored=True
            )
        elif self._rows_root is not None:
            listed = pipeline | "ListRows" >> ListRows(self._rows_root, allow_outside_root=self._allow_outside_root)
        else:
            assert self._input_list is not None, "__init__ takes exactly one of the three sources"
            listed = pipeline | "ListInputList" >> ListInputList(
                self._input_list, allow_outside_root=self._allow_outside_root, with_ignored=True
            )
        listing, ignored = listed[LISTING], listed[IGNORED]
        # listing: InputFile | DeadLetter; ignored: the Ignored kind of each entry left out on purpose
        if self._dedup == "content":
            listing = (
                listing
                | "SpreadListing" >> beam.Reshuffle()
                | "HashContent" >> beam.Map(_with_content_hash, max_file_bytes=config.max_file_bytes)
                # InputFile(..., content_sha256) | DeadLetter
            )
        append = self._change_kind == "append"
        base = self._expected.manifest if append and self._expected is not None else None
        held = held_keys = None
        if base is not None:
            assert self._expected is not None, "base is the manifest of the version appended to"
            held = (
                pipeline
                | "HeldShards" >> beam.Create(held_sidecars(base))
                | "ReadHeldInputs"
                >> beam.FlatMap(read_held_inputs, output_dir=output_dir, version=self._expected.version)
            )
            # (path relative to the source's root, {state, digests, label, split, ...}): every
            # input the current version holds
            held_keys = held | "HeldContentKeys" >> beam.FlatMap(held_content_keys)
            # (sha256, (identity, label)): every example it holds, in the shape of CONTENT_KEYS
        planned = listing | "PlanShards" >> PlanShards(
            held=held,
            known_labels=_label_lineage(output_dir, self._expected, self._relabel),
            known_kinds=annotation_kinds_of(base) if base else (),
            state_of=partial(source_state, timeout_s=READ_TIMEOUT_S),
            digests_of=partial(source_digests, timeout_s=READ_TIMEOUT_S),
            held_content=held_keys,
            held_version=self._expected.version if base is not None and self._expected is not None else None,
            from_tree=self._input_root is not None and not self._coco_files,
            tree_layout=self._tree_layout,
            source=self._input_root or self._input_list or f"the rows under {self._rows_root}",
            split_fractions=self._split_fractions,
            split_rule=self._split_rule,
            num_shards=self._num_shards,
            example_bytes=estimate_example_bytes(
                width=config.width, height=config.height, channels=config.channels, encoding=config.encoding
            ),
            target_shard_bytes=self._target_shard_bytes,
            dedup=self._dedup,
        )
        # shards: ShardPlan(split, index, num_shards, inputs); plan_dead_letters: DeadLetter;
        # plan_summary: {label_names, num_inputs, splits: {num_examples, num_shards, class_counts}}
        current = self._expected.manifest if self._expected is not None else None
        plan_summary = planned[PLAN_SUMMARY] | "LabelIds" >> beam.Map(
            with_label_map,
            before=tuple(current["label_names"]) if current else (),
            retired_before=tuple(current.get("retired_labels", ())) if current else (),
            relabel=self._relabel,
            appending=append,
        )
        # the plan's summary, plus retired_labels and label_ids_changed (what its map changes)
        ignored_counts = beam.pvalue.AsList(ignored | "CountIgnored" >> beam.combiners.Count.PerElement())
        # [(Ignored kind, count)]
        if self._plan_only:
            plan_parts = (
                planned[PLAN_DEAD_LETTERS]
                | "KeyPlanDeadLetters" >> beam.Map(lambda d: (dead_letter_part(d), d))
                | "GroupPlanDeadLetters" >> beam.GroupByKey()
                | "WritePlanDeadLetters"
                >> beam.Map(write_dead_letter_part, output_dir=output_dir, prefix="plan_dead_letters")
            )
            return (
                plan_summary
                | "WithIgnored" >> beam.Map(lambda plan, counts: {**plan, "ignored": dict(counts)}, ignored_counts)
                | "WritePlan"
                >> beam.Map(
                    write_plan,
                    beam.pvalue.AsList(plan_parts),
                    output_dir=output_dir,
                    settings=self._settings,
                    max_bad_fraction=self._max_bad_fraction,
                )
            )
            # dict: plan.json as written, plus its one-line summary
        shards = planned["shards"]
        if base is not None:
            assert self._expected is not None, "base is the manifest of the version appended to"
            changes = (
                planned[PLAN_CHANGES]
                | "CountSourceChanges" >> beam.CombineGlobally(SourceChangesFn())
                | "CheckSourceChanges"
                >> beam.Map(check_source_changes, policy=self._changed_sources, version=self._expected.version)
            )
            plan_summary = plan_summary | "OfTheAppend" >> beam.Map(_append_summary, beam.pvalue.AsSingleton(changes))
            # Through the check's result, so that no shard is converted before an append is refused.
            shards = shards | "AfterSourceCheck" >> beam.Map(lambda shard, _: shard, beam.pvalue.AsSingleton(changes))
        summary = plan_summary | LOG_PLAN_STEP >> beam.Map(
            _log_plan,
            beam.pvalue.AsList(
                planned[PLAN_DEAD_LETTERS]
                | "PlanDeadLetterReasons" >> beam.Map(lambda d: (d.reason, 1))
                | "CountPlanReasons" >> beam.CombinePerKey(sum)
                | "PlanReasonParts" >> beam.Map(lambda kv: {"by_reason": {kv[0]: kv[1]}})
            ),
            ignored_counts,
            output_dir=folder,
            run_id=self._run_id,
        )
        converted = (
            shards
            | "SpreadShards" >> beam.Reshuffle()
            | "ConvertShards"
            >> beam.ParDo(
                ConvertShardFn(
                    config,
                    folder,
                    run_fingerprint=run_fingerprint(config, self._settings),
                    resume=self._resume,
                    convert_threads=self._convert_threads,
                    run_id=self._run_id,
                    preprocessing={**config.to_json(), **self._settings},
                    made_for=run_made_for(self._expected.version if base is not None and self._expected else None),
                )
            ).with_outputs(DEAD_LETTERS, CONTENT_KEYS, main="shards")
        )
        # shards: ShardResult(split, index, file, num_examples, bytes, sha256); dead_letters: DeadLetter;
        # content_keys: (sha256 of source bytes, (filename, label))
        # An append groups its new examples with the version's own: identical bytes across
        # versions are reported as in one run (append.merge_appended merges the groups).
        content_keys = (
            (converted[CONTENT_KEYS], held_keys) | "WithHeldContentKeys" >> beam.Flatten()
            if held_keys is not None
            else converted[CONTENT_KEYS]
        )
        duplicates = (
            content_keys
            | "GroupByContent" >> beam.GroupByKey()
            # (sha256, [(filename, label), ...])
            | "DuplicateGroups" >> beam.FlatMap(_duplicate_groups)
            # {"sha256", "files", "labels", "conflicting_labels"} for groups of two or more
        )
        dead_parts = (
            (planned[PLAN_DEAD_LETTERS], converted[DEAD_LETTERS])
            | "AllDeadLetters" >> beam.Flatten()
            | "KeyDeadLetters" >> beam.Map(lambda d: (dead_letter_part(d), d))
            | "GroupDeadLetters" >> beam.GroupByKey()
            # (part, [DeadLetter, ...]): 1/DEAD_LETTER_PARTS of them each
            | "WriteDeadLetterParts" >> beam.Map(write_dead_letter_part, output_dir=folder)
            # {"part", "count", "by_reason"}
        )
        return (
            converted.shards
            | "GatherShards" >> beam.combiners.ToList()
            # [ShardResult, ...]: one small record per shard
            | "WriteManifest"
            >> beam.Map(
                finalize_outputs,
                summary=beam.pvalue.AsSingleton(summary),
                dead_parts=beam.pvalue.AsList(dead_parts),
                content_duplicates=beam.pvalue.AsList(duplicates),
                output_dir=output_dir,
                run=self._run_id,
                expected=self._expected,
                change_kind=self._change_kind,
                config=config,
                settings=self._settings,
                max_bad_fraction=self._max_bad_fraction,
                keep_versions=self._keep_versions,
                run_id=self._run_id,
                base=base,
            )
            # dict: the dataset_info.json that was written
        )


def _label_lineage(output_dir: str, expected: Current | None, relabel: str) -> tuple[str, ...]:
    """The label names whose ids this run keeps, in id order (rules.label_lineage): none for a first
    version, or with --relabel sorted."""
    if relabel == "sorted" or expected is None or expected.manifest is None:
        return ()
    try:
        from beam_jobs.versions import history  # pylint: disable=import-outside-toplevel  # cycle

        older = [m for m in history(output_dir) if m.get("version") != expected.version]
    except Exception as error:  # pylint: disable=broad-except  # the current version's ids, at least, are kept
        _LOG.warning(
            "the history of %s is unreadable (%s): label ids follow the current version's", redact(output_dir), error
        )
        older = []
    return label_lineage([expected.manifest, *older])


def _append_summary(summary: dict, changes: dict) -> dict:
    """The plan's facts for an append run: its inputs are those not held yet (the held ones, and
    the changed ones kept as they are, are not converted again), and the changes found."""
    # The plan's warnings about the whole dataset (a class missing from a split, --splits that no
    # input needed) would be about the new inputs alone: finalize states them from the merged counts.
    warnings = [w for w in summary.get("warnings", []) if not WHOLE_DATASET_WARNING.match(w)]
    return {
        **summary,
        "num_inputs": summary["num_inputs"] - changes["held"] - changes["changed"],
        "append": changes,
        "warnings": warnings,
    }


def _write_stderr(text: str) -> None:
    _write_to(sys.stderr, text)


def _write_to(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (ValueError, OSError):  # Closed: nowhere left to say it.
        pass


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


def run(argv: Sequence[str] | None = None) -> dict:
    """Runs the job and returns the dataset_info.json it wrote. The only place that reads argv."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
    arguments, options = parse_job_arguments(argv)
    spare = child_pids()  # the caller's own child processes: never the run's to end
    # The job's own filesystem calls (probes, finalize) need the same options as the workers'
    # (S3 endpoint and keys, GCP project); Beam only hands them to its own transforms.
    FileSystems.set_options(options)
    check_endpoint_reachable(options, [arguments.source, arguments.output_dir])
    check_inputs_exist(arguments)
    check_output_outside_input(arguments)
    config = arguments.image_config
    output_dir = arguments.output_dir
    created = make_output_dir(output_dir)
    lock = None
    say = {"now": _write_stderr}  # where a stuck SIGTERM's line goes: the console's terminal, once there is one
    run_id = None
    info_before = info_stamp(output_dir)

    def state() -> InterruptedState:
        return _interrupted_state(output_dir, run_id, info_before)

    try:
        lock = acquire_output_lock(output_dir)
        on_stuck(lambda signum: _abandon(output_dir, lock, created, run_id, spare))
        on_stuck(
            lambda signum: say["now"](
                _interrupted_line(argv, terminated=signum == signal.SIGTERM, state=state()) + "\n"
            )
        )
        # The version this run starts from: it commits only if that is still the current one.
        current = read_current(output_dir)
        kind = "create"
        if arguments.plan_only:  # A plan only writes plan.json, beside whatever is there.
            check_plan_file(output_dir)
        else:
            run_id, kind = check_output_dir(
                output_dir,
                current,
                overwrite=arguments.overwrite,
                resume=arguments.resume,
                fingerprint=run_fingerprint(config, arguments.settings),
                preprocessing={**config.to_json(), **arguments.settings},
                append=arguments.append,
                append_fingerprint=fingerprint_with_layout_of(current.manifest, config, arguments.settings),
            )
        runner, parallelism = local_runner(options, argv, log_level=arguments.log_level)
        _DETAILS.info("converting %s into %s", redact(arguments.source), redact(output_dir))
        pipeline = beam.Pipeline(runner=runner, options=options)
        _ = pipeline | "ConvertImages" >> ConvertImages(
            input_root=arguments.input_root,
            input_list=arguments.input_list,
            coco_files=arguments.coco_files,
            keep_unannotated=arguments.unannotated == "keep",
            coco_masks=arguments.coco_masks,
            relabel=arguments.relabel,
            output_dir=output_dir,
            image_config=config,
            split_fractions=arguments.split_fractions,
            num_shards=arguments.num_shards,
            target_shard_bytes=arguments.target_shard_bytes,
            max_bad_fraction=arguments.max_bad_fraction,
            settings=arguments.settings,
            dedup=arguments.dedup,
            resume=arguments.resume,
            allow_outside_root=arguments.allow_outside_root,
            tree_layout=arguments.tree_layout,
            plan_only=arguments.plan_only,
            run_id=run_id,
            split_rule=arguments.split_rule,
            expected=current,
            change_kind=kind,
            keep_versions=arguments.keep_versions,
            changed_sources=arguments.changed_sources,
            convert_threads=parallelism.convert_threads if parallelism is not None else CONVERT_THREADS,
        )
        with hide_worker_tracebacks(enabled=arguments.log_level != "DEBUG") as console:
            say["now"] = lambda text: _write_to(console.terminal, text)
            watcher, display = (
                (None, None)
                if run_id is None
                else _watch(console, run_dir(output_dir, run_id), run_id, plain=arguments.log_level == "DEBUG")
            )
            succeeded = False
            try:
                result = pipeline.run()
                job_id = getattr(result, "job_id", None)
                hint = watch_hint(options, job_id() if callable(job_id) else None)
                if hint:
                    console.emit(hint + "\n")
                result.wait_until_finish()
                succeeded = True
            except KeyboardInterrupt:
                interrupt_caught()
                console.mute()  # The workers' dying words would bury the one line that matters.
                raise
            except Exception as error:
                interrupt = _interrupt_within(error)
                if interrupt is None:
                    raise
                interrupt_caught()
                console.mute()
                raise interrupt from None
            finally:
                if watcher is not None and display is not None:
                    watcher.stop(succeeded=succeeded)
                    console.sink = None
                    display.close()
                    watcher.remove_progress_file()
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            interrupt_caught()
        if lock is not None:
            # Interrupted or failed (a full disk, a bad step): the workers a failing runner leaves
            # may still be writing; once they are ended, every temp file is a dead writer's.
            _clean_up_interrupted(output_dir, run_id, spare)
        if lock is not None:
            release_output_lock(lock)
        if run_id is not None:
            remove_created([run_dir(output_dir, run_id), FileSystems.join(output_dir, SHARDS_DIR)])
        remove_created(created)
        if isinstance(error, KeyboardInterrupt):
            try:
                error.state = state()  # type: ignore[attr-defined]  # what main() reports, read before the line is printed
            except Exception:  # The line then says what holds in every case.
                pass
        raise
    released = False
    try:
        release_output_lock(lock)
        released = True
        _log_counters(result)
        written = FileSystems.join(output_dir, PLAN_FILE if arguments.plan_only else DATASET_INFO)
        with FileSystems.open(written) as handle:
            info = json.loads(handle.read().decode("utf-8"))
    except KeyboardInterrupt as interrupt:  # The run is over: its line says what it left.
        interrupt_caught()
        if not released:
            release_output_lock(lock)
        with contextlib.suppress(Exception):
            finished = InterruptedState(completed=True, plan_only=True) if arguments.plan_only else state()
            interrupt.state = finished  # type: ignore[attr-defined]
        raise
    if arguments.append and info.get("version") == current.version and run_id is not None:
        # finalize found no new example and committed nothing: the new inputs, if any, are dead letters
        info["nothing_appended"] = _dead_letter_reasons(
            FileSystems.join(run_dir(output_dir, run_id), DEAD_LETTERS_FILE)
        )
    return info


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


def _watch(
    console: ConsoleFilter, output_dir: str, run_id: str, *, plain: bool
) -> tuple[StagingWatcher, LineProgress | TtyProgress]:
    """Starts watching the output folder: a bar on a terminal, else a line about every 10%."""
    tty = not plain and console.terminal.isatty()
    display = (TtyProgress if tty else LineProgress)(console.terminal, console.lock)
    if tty:
        console.sink = display.write  # Lines that pass the filter print above the bar.
    watcher = StagingWatcher(output_dir, run_id, on_plan=display.plan, on_progress=display.update)
    return watcher.start(), display


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


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _summary(info: dict, output_dir: str) -> str:
    splits = ", ".join(
        f"{name}: {_plural(s['num_examples'], 'example')} in {_plural(s['num_shards'], 'shard')}"
        for name, s in info["splits"].items()
    )
    by_reason = info.get("dead_letters_by_reason", {})
    dropped = sum(count for reason, count in by_reason.items() if reason in DROPPED_REASONS)
    unusable = info["num_dead_letters"] - dropped
    change = info.get("change") or {}
    # An append also drops the new inputs whose bytes the version holds under the same label.
    why = "--dedup, or bytes held already" if change.get("kind") == "append" else "--dedup"
    copies = f", {dropped} copies dropped ({why})" if dropped else ""
    committed = ""
    if info.get("version"):
        added = change.get("added")
        what = (
            f"appended {', '.join(f'{n} {split}' for split, n in (added or {}).items()) or 'no example'} to version "
            f"{info.get('parent_version')}"
            if change.get("kind") == "append"
            else change.get("kind", "create")
        )
        committed = f"committed version {info['version']} ({what}): "
    if not unusable and not dropped:  # an empty dead-letter file is not worth pointing to
        return f"{committed}wrote {splits} to {redact(output_dir)}; every input became an example"
    return (
        f"{committed}wrote {splits} to {redact(output_dir)}; {_plural(unusable, 'input')} could not be used"
        f"{copies} (see {FileSystems.join(redact(output_dir), info['dead_letters_file'])})"
    )


_STORAGE_ERRORS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")
# What the FnApiRunner raises when one of its worker processes dies (killed, out of memory).
_WORKER_LOST = ("Channel closed prematurely", "Worker subprocess exited with return code")
# The last "SomeError: message" line of a traceback, as runners pass worker failures on in text.
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit)): (.+)$", re.MULTILINE)
# Runners append the failing step to the message; it is worth keeping, the Java-side noise is not.
_STEP = re.compile(r"\[while running '([^']+)'\]")


def describe_failure(error: BaseException) -> tuple[str, bool]:
    """One line for a failed run, and whether a trace would help: our own message when the failure
    is ours, the storage problem when the disk said no, else the innermost error and its step."""
    text = redact(f"{type(error).__name__}: {error}")
    for own in (
        TooManyBadInputsError,
        OutputLockedError,
        SourceChangesError,
        CommitConflictError,
        JobError,
        UsageError,
    ):
        matches = re.findall(rf"{own.__name__}: (.+)", text)
        if matches:
            return _STEP.sub("", matches[-1]).strip(), False
    for needle in _STORAGE_ERRORS:
        if needle in text:
            where = re.search(rf"{re.escape(needle)}[^\n]*?: '([^']+)'", text)
            return (
                f"could not write the output: {needle}"
                + (f" ({where.group(1)})" if where else "")
                + "; nothing was committed (dataset_info.json, and the version it names, if any, are as "
                "they were; the shards completed so far stay in the run's folder for --resume)"
            ), False
    if any(needle in text for needle in _WORKER_LOST):
        return (
            "a worker process of the local runner ended without finishing its work (was it killed, or "
            "out of memory?); nothing was committed (dataset_info.json, and the version it names, if any, "
            "are as they were; the shards completed so far stay in the run's folder for --resume)"
        ), True
    lines = [m for m in _ERROR_LINE.finditer(text) if not m.group(2).startswith("[while running")]
    step = _STEP.findall(text)
    if not lines:
        first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        return first[:500], True
    name, message = lines[-1].group(1), _STEP.sub("", lines[-1].group(2)).strip()
    in_step = f" (in step {step[-1]})" if step else ""
    return f"{name}: {message[:500]}{in_step}", True


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


def _exit_now(code: int) -> None:
    """Ends an interrupted run once run() has cleaned up: the local runner's threads that wait on a
    bundle of a worker the signal killed would never finish, and a normal exit waits for them."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: every failure ends in one `images-to-tfrecords: error:` line.

    Exit 2 for a command line the job refuses (and an output folder another run holds), 1 for a run
    that failed, 130 when interrupted (SIGINT, Ctrl-C), 143 when terminated (SIGTERM), which is
    what a shell reports for a job each signal ended.
    With --log_level DEBUG the full trace is printed first.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    level = configure_job_logging(argv)
    try:
        with sigterm_as_interrupt():
            info = run(argv)
            # From here to the process's exit, a SIGTERM's line says that the run had finished.
            state_outside_the_run(InterruptedState(completed=True, plan_only="--plan_only" in argv))
    except (UsageError, OutputLockedError) as error:  # Refused before any work: exit 2 for both.
        print(f"{PROG}: error: {redact(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, Terminated)
        print(_interrupted_line(argv, terminated=terminated, state=getattr(interrupt, "state", None)), file=sys.stderr)
        _exit_now(143 if terminated else 130)  # 128 + the signal, as a shell reports a job it ended
    except Exception as error:  # Runners wrap worker exceptions; surface the cause plainly.
        if level == "DEBUG":
            traceback.print_exc()
        message, trace_helps = describe_failure(error)
        hint = " (--log_level DEBUG shows the full trace)" if trace_helps and level != "DEBUG" else ""
        print(f"{PROG}: error: {message}{hint}", file=sys.stderr)
        raise SystemExit(1) from None
    arguments = parse_job_arguments(argv)[0]
    if arguments.plan_only:
        print(
            f"{plan_line(info, info['dead_letters']['by_reason'])}{ignored_note(info.get('ignored', {}))}; wrote "
            f"{redact(FileSystems.join(arguments.output_dir, PLAN_FILE))}"
        )
        for warning in plan_warning_lines(info):
            print(warning)
        if info.get("would_fail"):
            print(
                f"{PROG}: error: {info['would_fail']} (see "
                f"{redact(FileSystems.join(arguments.output_dir, info['dead_letters']['file']))})",
                file=sys.stderr,
            )
            raise SystemExit(1)
        return
    if info.get("nothing_appended"):
        by_reason = info["nothing_appended"]["by_reason"]
        dead = sum(by_reason.values())
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items()))
        print(
            f"--append: version {info.get('version')} stays current; nothing was committed"
            + (
                f": no input it did not hold became an example; this run's {_plural(dead, 'dead letter')} "
                f"({reasons}) {'is' if dead == 1 else 'are'} in {redact(info['nothing_appended']['file'])}"
                if dead
                else ""
            )
        )
        return
    print(split_table(info))
    # Repeated at the end, with those the plan could not know (a class whose examples of a split
    # all became dead letters): the plan line scrolled away long ago on a long run.
    for warning in plan_warning_lines(info):
        print(warning)
    print(_summary(info, arguments.output_dir))
    print("\n".join(outputs_lines(info, arguments.output_dir)))
    print("\n".join(next_steps_lines(info, arguments.output_dir)))

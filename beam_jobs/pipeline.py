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
import socket
import sys
import traceback
import urllib.parse
import warnings
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, TextIO

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.command_line.arguments import (
    PROG,
    JobArguments,
    UsageError,
    absolute_uri,
    expand_verbosity,
    help_parser,
    parse_job_arguments,
    run_settings,
)
from beam_jobs.command_line.console import ConsoleFilter, RelayedWorkerRecords, hide_worker_tracebacks
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
from beam_jobs.imaging.resample import LEGACY_RESAMPLE
from beam_jobs.listing.coco import ListCoco
from beam_jobs.listing.discover import IGNORED, LISTING, ListInputList, ListRows, ListTree, input_list_files
from beam_jobs.listing.policy import ignored_note
from beam_jobs.local_runner import QUIET_LOGGERS, local_runner
from beam_jobs.paths import redact
from beam_jobs.planning.rules import (
    DEFAULT_SPLIT_RULE,
    DEFAULT_TARGET_SHARD_MB,
    estimate_example_bytes,
    label_lineage,
    with_label_map,
)
from beam_jobs.planning.transforms import PLAN_CHANGES, PLAN_DEAD_LETTERS, PLAN_SUMMARY, PlanShards, SourceChangesFn
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import bucket_problem, delete_exactly, list_folder, list_tree, temp_name
from beam_jobs.third_party_warnings import warnings_to_debug_log
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
    is_own_plan,
    plan_line,
    plan_warning_lines,
    run_fingerprint,
    write_dead_letter_part,
    write_plan,
)
from beam_jobs.writing.run_folders import SHARDS_DIR, listed_runs, new_run_name, resumable_runs, run_dir
from beam_jobs.writing.run_lock import LOCK_NAME, OutputLockedError, acquire_output_lock, release_output_lock
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
        summary = plan_summary | _LOG_PLAN_STEP >> beam.Map(
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


def _made_with(manifest: dict) -> dict:
    """A manifest's preprocessing settings; one written before --resample existed was made with
    its only resampling (the same bytes as --resample bicubic now)."""
    return {"resample": LEGACY_RESAMPLE, **(manifest.get("preprocessing") or {})}


# The settings that say how examples are cut into shards, not what an example is: an append
# writes its new examples in shards of its own, so it may give other values than the version's.
SHARD_LAYOUT = ("num_shards", "target_shard_mb")


def _fingerprint_with_layout_of(manifest: dict | None, config: ImageConfig, settings: dict) -> str | None:
    """This run's fingerprint had it the shard layout of ``manifest``'s run: what --append compares
    with the manifest's own, so that --num_shards or --target_shard_mb never refuse an append.
    None when there is no manifest, or it records no settings (an older format: compared as is)."""
    made = (manifest or {}).get("preprocessing")
    if not made:
        return None
    return run_fingerprint(config, {**settings, **{k: made.get(k) for k in SHARD_LAYOUT if k in settings}})


def _differences(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k} {old.get(k)!r} there, {new.get(k)!r} now" for k in keys[:6]) or "an older format"


def _check_endpoint_reachable(options: PipelineOptions, uris: Sequence[str], *, timeout: float = 5.0) -> None:
    """Fails in seconds when --s3_endpoint_url refuses connections (a wrong port, a stopped server).

    Beam's S3 client retries a refused connection with backoff for minutes before it reports
    it, and a refused connection is never transient enough to wait for.
    """
    if not any(str(uri).lower().startswith("s3://") for uri in uris):
        return
    endpoint = options.get_all_options().get("s3_endpoint_url")
    if not endpoint:
        return
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            pass
    except (OSError, ValueError) as error:
        why = (
            "connection refused"
            if isinstance(error, ConnectionRefusedError)
            else (
                f"no answer in {timeout:g} s" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            )
        )
        raise UsageError(f"cannot reach --s3_endpoint_url {redact(endpoint)}: {why}") from None


def _check_inputs_exist(arguments: JobArguments) -> None:
    """Fails before anything is created when the input cannot be what the flag says it is."""
    if arguments.input_list is not None:
        path = arguments.input_list
        if "://" not in path and os.path.isdir(path):
            raise UsageError(
                f"--manifest {path} is a folder; --manifest takes a CSV or JSONL file listing "
                "the images (for a class-per-folder tree use --input)"
            )
        if not input_list_files(path):
            raise UsageError(f"--manifest {redact(path)} does not exist (nor does any file match it)")
        return
    for _, coco in arguments.coco_files or ():
        if not FileSystems.exists(coco):
            raise UsageError(f"--coco_annotations {redact(coco)} does not exist")
    root = arguments.input_root
    assert root is not None  # The parser takes exactly one of --input and --manifest.
    if "://" not in root:
        if os.path.isfile(root):
            raise UsageError(
                f"--input {root} is a file; --input takes the root folder of a class-per-folder "
                "tree (ROOT/<label>/<image>); for a CSV or JSONL list of images use --manifest"
            )
        if not os.path.isdir(root):
            raise UsageError(f"--input {root} does not exist")
    elif not list_tree(root, limit=1):
        problem = bucket_problem(root)
        raise UsageError(f"--input {redact(root)}: {problem or 'no files found under it'}")


def _check_output_outside_input(arguments: JobArguments) -> None:
    """Refuses an --output_dir equal to or inside the --input tree: the dataset would be written
    among the images, and a later run would list the output folder as one more class. An input
    list (or a COCO file) names its images one by one, so its output may be anywhere."""
    if arguments.input_list is not None or arguments.coco_files:
        return
    given_root = arguments.input_root
    assert given_root is not None  # The parser takes exactly one of --input and --manifest.
    root, output = given_root, arguments.output_dir
    if "://" not in root and "://" not in output:
        root, output = os.path.realpath(root), os.path.realpath(output)
    root, output = root.rstrip("/") + "/", output.rstrip("/") + "/"
    if output.startswith(root):
        where = "is" if output == root else "lies inside"
        raise UsageError(
            f"--output_dir {redact(arguments.output_dir)} {where} the --input tree "
            f"{redact(given_root)}; the dataset would be mixed with the images (and read as "
            "a class by the next run): choose an output folder outside it"
        )


def _make_output_dir(output_dir: str) -> list[str]:
    """Creates --output_dir (and its missing parents) and proves it writable; returns the folders
    it created, deepest first, so that a run that fails at once can remove them again."""
    created = []
    if "://" not in output_dir:
        if os.path.exists(output_dir) and not os.path.isdir(output_dir):
            raise UsageError(f"--output_dir {output_dir} is a file, not a folder")
        folder = output_dir
        while not os.path.exists(folder):
            created.append(folder)
            folder = os.path.dirname(folder)
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise UsageError(f"--output_dir {output_dir} lies under {folder}, which is a file")
    try:
        if not FileSystems.exists(output_dir):
            FileSystems.mkdirs(output_dir)
        # Fail now, with a clear message, rather than after converting everything.
        _probe_writable(output_dir)
    except Exception as error:
        _remove_created(created)
        raise UsageError(f"cannot write to --output_dir {redact(output_dir)}: {redact(str(error))}") from None
    return created


def _probe_writable(output_dir: str) -> None:
    """Writes and deletes a small object, removing it whatever happens in between.

    On an object store the probe is an object in the user's bucket: a failure (or an interrupt)
    after the write must not leave it behind. A store that accepts the write but refuses the
    delete gets an error naming the object, since the job could not clean up its temp files
    there either.
    """
    probe = FileSystems.join(output_dir, temp_name("probe"))
    try:
        # Not empty: Beam's S3 writer cannot write a zero-byte object (see storage._create_empty),
        # and the probe should take the path every shard takes.
        with FileSystems.create(probe) as handle:
            handle.write(b"images-to-tfrecords write probe\n")
    except BaseException:
        try:  # A write that failed late (or was interrupted) may still have created the object.
            if FileSystems.exists(probe):
                delete_exactly([probe])
        except Exception:  # The write's own error is the one to report.
            pass
        raise
    try:
        delete_exactly([probe])
    except Exception as error:
        raise OSError(
            f"wrote {probe} but could not delete it ({error}); the job deletes its temp files "
            "as it goes, so it needs delete permission there (remove that object by hand)"
        ) from None


# This run's progress file (shard_progress.progress_file_name); only this run's exists while it holds the lock
# and finalize has not yet removed those of killed runs.
_PROGRESS_FILE = re.compile(r"^\.progress-.+\.json$")
# Any file being written (storage.temp_name): a killed writer's leftover once no writer is alive.
_TEMP_FILE = re.compile(r"^\.tmp-[0-9a-f]{32}-")
# The output probe's and the lock's temp names (storage.temp_name): a killed run's leftovers.
# A shard's sidecar in its run folder (convert.sidecar_name): counted after an interrupt.
_SIDECAR = re.compile(r"^\..+\.tfrecord\.json$")
_RUN_TEMP_FILE = re.compile(r"^\.tmp-[0-9a-f]{32}-(probe|" + re.escape(LOCK_NAME) + r")$")


def _check_output_dir(
    output_dir: str,
    current: Current,
    *,
    overwrite: bool,
    resume: bool,
    fingerprint: str,
    preprocessing: dict,
    append: bool = False,
    append_fingerprint: str | None = None,
) -> tuple[str, str]:
    """Decides what this run may do with the folder; returns (its run name, its change kind).

    A run writes only into its own folder under shards/ and commits by one write of
    dataset_info.json (commit.py), so no flag ever deletes or replaces a file up front, and files
    of the user's that look like the job's (a "train-00000-of-00001.tfrecord" of their own) are
    simply left beside the dataset.

    - a folder holding a dataset: refused without a flag that says what to do with it;
    - --overwrite: the run commits a new version holding only its own shards; the one it replaces
      stays whole (kept for the retention window, see `versions gc`);
    - --resume: continues the newest uncommitted run folder whose shards were made with the same
      settings (each shard is verified later against its sidecar and its sources); with a dataset
      of other settings there, only with --overwrite.
    """
    names = {m.path.rsplit("/", 1)[-1]: m.path for m in list_folder(output_dir)}
    # A probe or lock temp file is never data: a run killed (SIGKILL, which runs no cleanup)
    # between writing and renaming or deleting it leaves it. This run holds the lock, so no live
    # run is writing one.
    leftovers = sorted(name for name in names if _RUN_TEMP_FILE.match(name))
    if leftovers:
        _LOG.info(
            "removing %d temp file(s) of a killed run from %s: %s",
            len(leftovers),
            redact(output_dir),
            ", ".join(leftovers),
        )
        delete_exactly([names.pop(name) for name in leftovers])
    previous = current.manifest
    if append:
        if previous is None:
            raise UsageError(
                f"--append: --output_dir {redact(output_dir)} holds no dataset to append to (no "
                f"{DATASET_INFO}); run without --append to create one"
            )
        if previous.get("fingerprint") not in (fingerprint, append_fingerprint):
            changed = _differences(
                {k: v for k, v in _made_with(previous).items() if k not in SHARD_LAYOUT},
                {k: v for k, v in preprocessing.items() if k not in SHARD_LAYOUT},
            )
            raise UsageError(
                f"--append: version {current.version} in {redact(output_dir)} was made with other settings "
                f"({changed}); an append takes the same flags as the run that made the dataset, so that "
                "its examples stay alike (the shard count and size may differ)"
            )
    if previous is not None and not (overwrite or resume or append):
        raise UsageError(
            f"--output_dir {redact(output_dir)} already holds a dataset (version {current.version}, {DATASET_INFO}); "
            "pass --overwrite to replace it with a new version (the current one stays readable until a later "
            "commit removes it), --resume to continue an interrupted run with the same flags, or choose another "
            "folder"
        )
    if previous is not None and resume and not overwrite and previous.get("fingerprint") != fingerprint:
        raise UsageError(
            f"--output_dir {redact(output_dir)} holds a dataset made with other settings "
            f"({_differences(_made_with(previous), preprocessing)}); --resume only continues a run "
            "with the same flags. Pass --overwrite to replace it, or choose another folder"
        )
    kind = "create" if previous is None else "append" if append else "overwrite"
    if previous is not None and not append:
        _LOG.info(
            "--overwrite: version %s in %s stays current until this run commits the next one",
            current.version,
            redact(output_dir),
        )
    committed = listed_runs(_committed_manifests(output_dir, current))
    if not resume:
        if any(_continuable(found, fingerprint) for _, found in resumable_runs(output_dir, committed)):
            # Said before the work, not after: the earlier run's shards are removed once this run commits.
            _LOG.warning(
                "an interrupted earlier run in %s left shards made with these same settings; this run "
                "converts everything again and removes them when it commits (stop it now and rerun "
                "with --resume to keep them)",
                redact(output_dir),
            )
        return new_run_name(), kind
    unkept, differences = 0, set[str]()
    for run, found in resumable_runs(output_dir, committed):
        if _continuable(found, fingerprint):
            _LOG.info("--resume: continuing the run in %s", redact(run_dir(output_dir, run)))
            return run, kind
        if found:
            unkept += 1
            differences.update(
                _differences(settings, preprocessing)
                for key, settings in found.items()
                if key not in (fingerprint, None)
            )
    if unkept:
        _LOG.warning(
            "--resume: the shards of %d earlier run%s in %s %s not kept: made with other settings (%s); "
            "this run converts everything again with the flags given now",
            unkept,
            "" if unkept == 1 else "s",
            redact(output_dir),
            "is" if unkept == 1 else "are",
            "; ".join(sorted(differences)),
        )
    if previous is not None and not overwrite and not append:
        # Said by default (the --overwrite notice above is INFO): the user asked to finish a run,
        # and this one will replace a complete dataset instead.
        _LOG.warning(
            "--resume: %s holds no interrupted run to continue, and its version %s is complete; this run "
            "converts everything again and commits the next version (stop it now if that is not what you want)",
            redact(output_dir),
            current.version,
        )
    return new_run_name(), kind


def _continuable(found: dict, fingerprint: str) -> bool:
    """Whether --resume continues a run folder whose sidecars record the fingerprints ``found``:
    it has shards, and all were made with this run's settings (None: a sidecar older than them)."""
    return bool(found) and set(found) <= {fingerprint, None}


def _committed_manifests(output_dir: str, current: Current) -> list[dict]:
    """The current manifest and the history's: what lists the run folders a --resume must not reuse."""
    try:
        from beam_jobs.versions import history  # pylint: disable=import-outside-toplevel  # cycle

        return history(output_dir)
    except Exception:  # An unreadable history: the current version's folders, at least, stay untouched.
        return [current.manifest] if current.manifest else []


def _check_plan_file(output_dir: str) -> None:
    """--plan_only replaces its own earlier plan.json, never a file of the user's of that name."""
    path = FileSystems.join(output_dir, PLAN_FILE)
    if FileSystems.exists(path) and not is_own_plan(path):
        raise UsageError(
            f"--output_dir {redact(output_dir)} holds a {PLAN_FILE} that this job did not write "
            f"({redact(path)}); --plan_only would replace it: move it, or choose another folder"
        )


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
            delete_exactly([path for name, path in names.items() if _PROGRESS_FILE.match(name)])
        except Exception:  # The progress file is hidden and small; the lock matters more.
            pass
    release_output_lock(lock)
    _remove_created(created)


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
            leftovers = [m.path for m in list_folder(folder) if _TEMP_FILE.match(m.path.rsplit("/", 1)[-1])]
            delete_exactly(leftovers)
        except Exception as error:  # The interrupt is what the user must hear about; a --resume removes them.
            _LOG.warning("could not remove the temp files in %s: %s", redact(folder), error)


def _remove_created(folders: list[str]) -> None:
    """Removes the folders this run created, deepest first, as long as they are empty."""
    for folder in folders:
        try:
            if "://" not in folder:
                os.rmdir(folder)
        except OSError:  # Not empty (or gone): it holds something worth keeping.
            return


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
    _check_endpoint_reachable(options, [arguments.source, arguments.output_dir])
    _check_inputs_exist(arguments)
    _check_output_outside_input(arguments)
    config = arguments.image_config
    output_dir = arguments.output_dir
    created = _make_output_dir(output_dir)
    lock = None
    say = {"now": _write_stderr}  # where a stuck SIGTERM's line goes: the console's terminal, once there is one
    run_id = None
    info_before = _info_stamp(output_dir)

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
            _check_plan_file(output_dir)
        else:
            run_id, kind = _check_output_dir(
                output_dir,
                current,
                overwrite=arguments.overwrite,
                resume=arguments.resume,
                fingerprint=run_fingerprint(config, arguments.settings),
                preprocessing={**config.to_json(), **arguments.settings},
                append=arguments.append,
                append_fingerprint=_fingerprint_with_layout_of(current.manifest, config, arguments.settings),
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
            _remove_created([run_dir(output_dir, run_id), FileSystems.join(output_dir, SHARDS_DIR)])
        _remove_created(created)
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


def _peek_log_level(argv: Sequence[str]) -> str:
    """--log_level (or -v) before the full parse, so that logging is set up before Beam says anything."""
    try:
        argv = expand_verbosity(argv)
    except UsageError:  # Reported by the full parse.
        pass
    for index, arg in enumerate(argv):
        if arg.startswith("--log_level="):
            return arg.split("=", 1)[1].upper()
        if arg == "--log_level" and index + 1 < len(argv):
            return argv[index + 1].upper()
    return "WARNING"


class _HideRunnerTraces(logging.Filter):
    """Below DEBUG, a failure is told in one line at the end; the runner's own logged copies of
    the worker's traceback (and of the bad-fraction refusal) would only bury it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and (
            record.exc_info or "Traceback (most recent call last)" in record.getMessage()
        ):
            return False
        return TooManyBadInputsError.__name__ not in record.getMessage()


class _ConsoleFormatter(logging.Formatter):
    """The job's own notices read as plain sentences; anything else (a warning, Beam's lines at
    --log_level INFO) says its level and origin; DEBUG adds timestamps."""

    def __init__(self, level: int) -> None:
        prefix = "%(asctime)s " if level <= logging.DEBUG else ""
        super().__init__(prefix + "%(levelname)s %(name)s: %(message)s")
        self._plain = logging.Formatter(prefix + "%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO and record.name.startswith("beam_jobs"):
            return self._plain.format(record)
        return super().format(record)


# Credential options: their values never reach a log line the job prints.
_CREDENTIAL_FLAGS = ("--s3_access_key_id", "--s3_secret_access_key", "--s3_session_token", "--azure_connection_string")
# At --log_level INFO, a line for each type hint of each step: only DEBUG shows them.
_CHATTY_BELOW_DEBUG = ("apache_beam.typehints.native_type_compatibility",)
# The step that logs the plan line on a worker; the launching process prints it from the
# progress file already (see StagingWatcher), so its relayed copy is not shown.
_LOG_PLAN_STEP = "LogPlan"


def _credential_values(argv: Sequence[str]) -> list[str]:
    """The values given to credential flags, as ``--flag value`` or ``--flag=value``."""
    values = []
    for index, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name in _CREDENTIAL_FLAGS:
            value = value if sep else (argv[index + 1] if index + 1 < len(argv) else "")
            if len(value) >= 4:  # A one-letter "key" would redact every word holding that letter.
                values.append(value)
    return sorted(set(values), key=len, reverse=True)


class _HideCredentials(logging.Filter):
    """Replaces the credential values given on the command line wherever a log line holds them:
    the runner relays workers' lines (their options included) as text, so matching by value is
    what catches them all."""

    def __init__(self, values: list[str]) -> None:
        super().__init__()
        self._values = values

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(value in message for value in self._values):
            for value in self._values:
                message = message.replace(value, "<redacted>")
            record.msg, record.args = message, None
        return True


def configure_job_logging(argv: Sequence[str], *, keep_handlers: bool = False) -> str:
    """Sets up the console's logging for a run of ``argv`` (its --log_level, credentials hidden);
    returns the level. The command line and ``beam_jobs.convert`` both start with it; the latter
    keeps the caller's handlers (see ``callers_logging_kept``)."""
    level = _peek_log_level(argv)
    _configure_logging(level, secrets=_credential_values(argv), force=not keep_handlers)
    warnings_to_debug_log()
    return level


def _touched_loggers() -> list[str]:
    return ["beam_jobs", "beam_jobs.details", *QUIET_LOGGERS, *_CHATTY_BELOW_DEBUG]


@contextlib.contextmanager
def callers_logging_kept() -> Iterator[None]:
    """Puts the logging configuration back as it was when the block ends: the root logger's
    handlers, their formatters and filters, and the levels the job sets. A notebook's or an
    application's own logging must not be replaced by one call of ``beam_jobs.convert``."""
    root = logging.getLogger()
    handlers = [(handler, handler.formatter, list(handler.filters)) for handler in root.handlers]
    levels = {name: logging.getLogger(name).level for name in ["", *_touched_loggers()]}
    show_warning = warnings.showwarning
    try:
        yield
    finally:
        warnings.showwarning = show_warning
        kept = [handler for handler, _, _ in handlers]
        for handler in list(root.handlers):
            if handler not in kept:
                root.removeHandler(handler)
                handler.close()
        for handler, formatter, filters in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
            handler.setFormatter(formatter)
            handler.filters[:] = filters
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _configure_logging(level: str, *, secrets: Sequence[str] = (), force: bool = True) -> None:
    numeric = getattr(logging, level, logging.WARNING)
    # force: Beam's import logs through the root logger, which configures it with logging's
    # bare "INFO:name:message" format before this runs. Without force, the caller's handlers stay
    # (one is made only where there is none) and only their format and filters change.
    logging.basicConfig(level=numeric, force=force)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_ConsoleFormatter(numeric))
    logging.getLogger().setLevel(numeric)
    logging.getLogger("beam_jobs").setLevel(min(numeric, logging.INFO))
    logging.getLogger("beam_jobs.details").setLevel(numeric)
    for name, quiet in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(max(numeric, getattr(logging, quiet)))
    for name in _CHATTY_BELOW_DEBUG:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING) if numeric > logging.DEBUG else numeric)
    for handler in logging.getLogger().handlers:
        # First: the filters below read the relayed record's own message.
        handler.addFilter(RelayedWorkerRecords(drop_steps=(_LOG_PLAN_STEP,)))
        if secrets:
            handler.addFilter(_HideCredentials(list(secrets)))
        if numeric > logging.DEBUG:
            handler.addFilter(_HideRunnerTraces())


def _info_stamp(output_dir: str) -> tuple | None:
    """(size, modification time) of the dataset_info.json there, or None: tells whether a run wrote one."""
    try:
        found = [m for m in list_folder(output_dir) if m.path.rsplit("/", 1)[-1] == DATASET_INFO]
    except Exception:  # The folder is gone (removed as created by this run) or unreadable.
        return None
    meta = found[0] if found else None
    return None if meta is None else (meta.size_in_bytes, meta.last_updated_in_seconds)


def _interrupted_state(output_dir: str, run_id: str | None, info_before: tuple | None) -> InterruptedState:
    """Reads the folder after an interrupt: this run's staged sidecars, and whether it had finished."""
    after = _info_stamp(output_dir)
    completed = after is not None and after != info_before
    if run_id is None:
        return InterruptedState(completed=completed)
    staged = 0
    try:
        sidecars = [
            m.path for m in list_folder(run_dir(output_dir, run_id)) if _SIDECAR.match(m.path.rsplit("/", 1)[-1])
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
                f": the {_plural(dead, 'new input')} could not be used ({reasons}), see "
                f"{redact(info['nothing_appended']['file'])}"
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

"""``ConvertImages(spec)``: the whole job as one transform, read as its data flow.

list -> plan -> convert -> commit, each a named transform of its own module:

    ListInputs (here)          the spec's source as InputFile | DeadLetter (listing/sources.py)
    HeldInputs (here)          an append's current version: what it holds (writing/append.py)
    PlanRun    (here)          splits, shards, label ids (planning/transforms.py)
    ConvertShards (here)       each shard planned, written and staged (writing/convert_shards.py)
    CommitRun  (here)          dead letters, duplicates, the manifest and the one commit (writing/finalize.py)
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import apache_beam as beam
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.errors import BadInputError
from beam_jobs.imaging.perceptual_hash import perceptual_hash
from beam_jobs.imaging.reading import READ_TIMEOUT_S, SourceReaders, read_source, source_digests, source_state
from beam_jobs.listing.names import clean_group
from beam_jobs.listing.policy import ignored_note
from beam_jobs.listing.sources import IGNORED, LISTING, ListSource
from beam_jobs.paths import redact
from beam_jobs.planning.rules import (
    estimate_example_bytes,
    label_lineage,
    with_label_map,
)
from beam_jobs.planning.transforms import (
    IGNORED_COUNTS,
    PLAN_CHANGES,
    PLAN_DEAD_LETTERS,
    PLAN_DEAD_REASONS,
    PLAN_SUMMARY,
    PlanShards,
    SourceChangesFn,
)
from beam_jobs.preflight import start_run, with_dataset_defaults
from beam_jobs.records import NO_SIGNATURE, DeadLetter, InputFile, ShardResult
from beam_jobs.run_context import RunContext
from beam_jobs.spec import ConversionSpec
from beam_jobs.spec_keywords import spec_of_keywords
from beam_jobs.versions import history
from beam_jobs.writing.append import (
    WHOLE_DATASET_WARNING,
    annotation_kinds_of,
    check_source_changes,
    held_content_keys,
    held_sidecars,
    read_held_inputs,
)
from beam_jobs.writing.commit import Current
from beam_jobs.writing.convert_shards import CONTENT_KEYS, DEAD_LETTERS, ConvertShardFn
from beam_jobs.writing.duplicates import content_duplicate_groups
from beam_jobs.writing.finalize import (
    dead_letter_part,
    finalize_outputs,
    plan_line,
    plan_warning_lines,
    run_fingerprint,
    write_dead_letter_part,
    write_plan,
)
from beam_jobs.writing.run_folders import run_dir, run_made_for
from beam_jobs.writing.shard_progress import write_progress_plan

__all__ = ["LOG_PLAN_STEP", "ConvertImages", "RunContext"]

_LOG = logging.getLogger("beam_jobs")
_DETAILS = logging.getLogger("beam_jobs.details")
# The step that logs the plan line on a worker; the launching process prints it from the
# progress file already (see command_line/progress.py), so the console drops its relayed copy.
LOG_PLAN_STEP = "LogPlan"


class ConvertImages(beam.PTransform):
    """Lists, plans, converts and commits: the whole job as one transform.

    ``ConvertImages(spec)`` converts what ``spec`` (a ConversionSpec) describes. Applied to a
    pipeline, it lists the spec's tree, input list or COCO files; applied to a PCollection of rows
    (dicts with ``uri`` and ``label``, optionally ``split``; read from BigQuery, say) with a spec
    whose source is ``Source(rows_root=...)``, it converts those. It returns a PCollection of one
    dict, the ``dataset_info.json`` it committed into the spec's output folder (with
    ``plan_only``, the plan.json written).

    The keyword form (``ConvertImages(rows_root=..., output_dir=..., image_config=...)``) builds
    the spec from the command line's settings under their Python names (see from_keywords).
    """

    def __init__(
        self,
        spec: ConversionSpec | None = None,
        *,
        run: RunContext | None = None,
        settings: dict | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        if spec is None:
            spec, run = spec_of_keywords(**keywords)
        elif keywords:
            raise TypeError(f"ConvertImages takes a spec or keywords, not both (got {sorted(keywords)})")
        # Without a given context, what the RunMode does to the folder is decided as a command-line
        # run decides it (preflight.with_dataset_defaults, start_run): one rule for every entry point.
        if run is None:
            spec = with_dataset_defaults(spec)
            run = start_run(spec)
        self._spec = spec
        self._run = run
        if spec.mode.relabel == "sorted" and self._run.change_kind == "append":
            raise ValueError(
                "relabel='sorted' renumbers label ids, and an append keeps the current version's shards with "
                "their ids: rebuild with overwrite and relabel='sorted' instead"
            )
        # What the manifest records and the fingerprint hashes besides the image settings.
        self._settings = settings if settings is not None else spec.settings

    @no_annotations
    def expand(self, start: beam.pvalue.PBegin | beam.PCollection) -> beam.PCollection:
        """The data flow, from the listing to the one commit."""
        spec, run = self._spec, self._run
        _check_applied_to(spec, start)
        listed = start | "ListInputs" >> ListInputs(spec)
        # {LISTING: InputFile | DeadLetter, IGNORED: Ignored kind}
        appended_to = run.appended_to
        held = (start.pipeline | "HeldInputs" >> HeldInputs(spec.output_dir, appended_to)) if appended_to else {}
        # an append's {HELD: (identity, record) of each input held, HELD_KEYS: (sha256, (identity, label))}
        planned = listed | "PlanRun" >> PlanRun(spec, run, held)
        # {SHARDS: ShardPlan, PLAN_DEAD_LETTERS: DeadLetter, PLAN_SUMMARY: the plan's facts, IGNORED_COUNTS: (kind, n)}
        if spec.mode.plan_only:
            return planned | "WritePlanOnly" >> WritePlanOnly(spec, self._settings)
            # dict: plan.json as written
        converted = planned[SHARDS] | "ConvertShards" >> ConvertShards(spec, run, self._settings)
        # {CONVERTED: ShardResult, DEAD_LETTERS: DeadLetter, CONTENT_KEYS: (sha256, (filename, label))}
        return {**planned, **converted, **held} | "CommitRun" >> CommitRun(spec, run, self._settings)
        # dict: the dataset_info.json committed


SHARDS = "shards"
CONVERTED = "converted"
HELD = "held"
HELD_KEYS = "held_keys"


class ListInputs(beam.PTransform):
    """The spec's source as inputs; with --dedup content, each with the sha256 of its bytes."""

    def __init__(self, spec: ConversionSpec) -> None:
        super().__init__()
        self._source = spec.source
        self._max_file_bytes = spec.image.max_file_bytes
        self._max_pixels = spec.image.max_pixels
        self._near_copies = _signatures_in_listing(spec)
        self._tone = spec.splits.signs_tone
        self._group_pattern = spec.splits.group_pattern

    @no_annotations
    def expand(self, start: beam.pvalue.PBegin | beam.PCollection) -> dict[str, beam.PCollection]:
        listed = start | "ListSource" >> ListSource(self._source)
        listing = listed[LISTING]
        if self._group_pattern is not None:
            listing = listing | "GroupByPattern" >> beam.Map(_with_pattern_group, pattern=self._group_pattern)
        if self._source.dedup == "content" or self._near_copies:
            listing = (
                listing
                | "SpreadListing" >> beam.Reshuffle()
                | "BatchToHash" >> beam.BatchElements(min_batch_size=8, max_batch_size=64)
                | "HashContent"
                >> beam.ParDo(
                    _HashSources(
                        max_file_bytes=self._max_file_bytes,
                        max_pixels=self._max_pixels if self._near_copies else None,
                        sha256=self._source.dedup == "content",
                        tone=self._tone,
                    )
                )
                # InputFile(..., content_sha256, phash) | DeadLetter
            )
        return {LISTING: listing, IGNORED: listed[IGNORED]}


def _signatures_in_listing(spec: ConversionSpec) -> bool:
    """Whether the listing computes the perceptual signatures (with --dedup content's sha256, from
    the same read); an append's planning does instead, for its new inputs only (HashSignatures),
    so that it never decodes the collection it holds again. In the listing they overlap the rest of
    it: 1.43x against 1.50x in planning, on 8,000 photos (benchmarks/near_copies.py)."""
    return spec.splits.groups == "near_copies" and not spec.mode.append


class HashSignatures(beam.PTransform):
    """InputFile -> InputFile with its perceptual signature (NO_SIGNATURE where it has none), in
    batches on each worker's reader threads (_HashSources): planning applies it to the inputs it
    is about to group, which an earlier shuffle has already spread over the workers."""

    def __init__(self, *, max_file_bytes: int, max_pixels: int, tone: bool) -> None:
        super().__init__()
        self._max_file_bytes = max_file_bytes
        self._max_pixels = max_pixels
        self._tone = tone

    @no_annotations
    def expand(self, inputs: beam.PCollection) -> beam.PCollection:
        return (
            inputs
            | "BatchToSign" >> beam.BatchElements(min_batch_size=8, max_batch_size=64)
            | "Sign"
            >> beam.ParDo(
                _HashSources(
                    max_file_bytes=self._max_file_bytes, max_pixels=self._max_pixels, sha256=False, tone=self._tone
                )
            )
        )


def _with_pattern_group(item: InputFile | DeadLetter, *, pattern: str) -> InputFile | DeadLetter:
    """--group_pattern: the input's user group is the capture of the pattern in its relative
    path (re.search; no match, no group). A group column of an input list wins."""
    if not isinstance(item, InputFile) or item.user_group is not None:
        return item
    match = re.search(pattern, item.filename)
    group = clean_group(match.group(1)) if match is not None else None
    return item if group is None else dataclasses.replace(item, user_group=group)


class _HashSources(beam.DoFn):
    """For --dedup=content, the sha256 of each input's bytes; for --split_groups near_copies
    (``max_pixels`` given) its perceptual signature too, from the same read, before planning.
    An unreadable input keeps None (and NO_SIGNATURE) and is dead-lettered by its conversion.

    It takes batches (BatchElements) and reads ahead on two reader threads with read_source's
    timeout: a Map of read_source starts a thread per read and waits for it, 0.2 ms each, half
    as much again as the hash itself."""

    def __init__(self, *, max_file_bytes: int, max_pixels: int | None, sha256: bool, tone: bool = True) -> None:
        self._max_file_bytes = max_file_bytes
        self._max_pixels = max_pixels
        self._sha256 = sha256
        self._tone = tone  # False: the legacy signature, for a dataset made with it
        self._readers: SourceReaders | None = None

    def setup(self) -> None:
        self._readers = SourceReaders(2, timeout_s=READ_TIMEOUT_S)

    def teardown(self) -> None:
        if self._readers is not None:
            self._readers.close()

    def process(self, batch: list[InputFile | DeadLetter]) -> Iterator[InputFile | DeadLetter]:
        assert self._readers is not None, "setup() starts the readers"
        yield from (item for item in batch if not isinstance(item, InputFile))
        inputs = [item for item in batch if isinstance(item, InputFile)]
        read = partial(_read_for_hash, max_file_bytes=self._max_file_bytes)
        for item, data in self._readers.read_ahead(inputs, read, window=_READ_AHEAD):
            yield self._hashed(item, data)

    def _hashed(self, item: InputFile, data: bytes | BadInputError) -> InputFile:
        if isinstance(data, BadInputError):
            return item if self._max_pixels is None else dataclasses.replace(item, phash=NO_SIGNATURE)
        phash = None
        if self._max_pixels is not None:
            signature = perceptual_hash(data, max_pixels=self._max_pixels, tone=self._tone)
            phash = NO_SIGNATURE if signature is None else signature
        digest = hashlib.sha256(data).hexdigest() if self._sha256 else item.content_sha256
        return dataclasses.replace(item, content_sha256=digest, phash=phash)


def _read_for_hash(item: InputFile, *, max_file_bytes: int) -> bytes:
    return read_source(item, max_file_bytes, timeout_s=None)  # SourceReaders times it


# Reads queued ahead of the hashing, per worker: they overlap the decodes, which release the GIL.
_READ_AHEAD = 4


class HeldInputs(beam.PTransform):
    """For an append: what the version appended to holds, read from its shards' sidecars. Empty
    for any other run (the planner then holds nothing)."""

    def __init__(self, output_dir: str, appended_to: Current | None) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._appended_to = appended_to

    @no_annotations
    def expand(self, pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
        version = self._appended_to
        assert version is not None and version.manifest is not None  # applied for an append only
        held = (
            pipeline
            | "HeldShards" >> beam.Create(held_sidecars(version.manifest))
            | "ReadHeldInputs" >> beam.FlatMap(read_held_inputs, output_dir=self._output_dir, version=version.version)
            # (path relative to the source's root, {state, digests, label, split, ...})
        )
        keys = held | "HeldContentKeys" >> beam.FlatMap(held_content_keys)
        # (sha256, (identity, label)): every example it holds, in the shape of CONTENT_KEYS
        return {HELD: held, HELD_KEYS: keys}


class PlanRun(beam.PTransform):
    """Inputs -> shard plans, with the plan's dead letters and its summary (label ids included);
    for an append, refused here when sources changed, before any shard is converted."""

    def __init__(self, spec: ConversionSpec, run: RunContext, held: dict[str, beam.PCollection]) -> None:
        super().__init__()
        self._spec = spec
        self._run = run
        self._held = held

    @no_annotations
    def expand(self, listed: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        spec, run, appended_to = self._spec, self._run, self._run.appended_to
        image = spec.image
        planned = listed[LISTING] | "PlanShards" >> PlanShards(
            held=self._held.get(HELD),
            known_labels=_label_lineage(spec.output_dir, run.expected, spec.mode.relabel),
            known_kinds=annotation_kinds_of(appended_to.manifest) if appended_to and appended_to.manifest else (),
            state_of=partial(source_state, timeout_s=READ_TIMEOUT_S),
            digests_of=partial(source_digests, timeout_s=READ_TIMEOUT_S),
            held_content=self._held.get(HELD_KEYS),
            held_version=appended_to.version if appended_to else None,
            from_tree=spec.source.kind == "tree",
            paths_unique=spec.source.kind == "tree" and "://" not in spec.source.where,
            tree_layout=spec.source.tree_layout,
            source=spec.source.where,
            split_fractions=None if spec.splits.fractions is None else dict(spec.splits.fractions),
            split_rule=spec.splits.rule,
            num_shards=spec.shards.num_shards,
            example_bytes=estimate_example_bytes(
                width=image.width, height=image.height, channels=image.channels, encoding=image.encoding
            ),
            target_shard_bytes=spec.shards.target_bytes,
            dedup=spec.source.dedup,
            ignored=listed[IGNORED],
            split_groups=_split_groups(spec),
            hash_signatures=(
                HashSignatures(
                    max_file_bytes=image.max_file_bytes, max_pixels=image.max_pixels, tone=spec.splits.signs_tone
                )
                if spec.splits.groups == "near_copies" and not _signatures_in_listing(spec)
                else None
            ),
        )
        # shards: ShardPlan(split, index, num_shards, inputs); plan_dead_letters: DeadLetter;
        # plan_summary: {label_names, num_inputs, splits: {num_examples, num_shards, class_counts}}
        current = run.expected.manifest if run.expected is not None else None
        summary = planned[PLAN_SUMMARY] | "LabelIds" >> beam.Map(
            with_label_map,
            before=tuple(current["label_names"]) if current else (),
            retired_before=tuple(current.get("retired_labels", ())) if current else (),
            relabel=spec.mode.relabel,
            appending=appended_to is not None,
        )
        # the plan's summary, plus retired_labels and label_ids_changed (what its map changes)
        shards = planned[SHARDS]
        if appended_to is not None:
            changes = (
                planned[PLAN_CHANGES]
                | "CountSourceChanges" >> beam.CombineGlobally(SourceChangesFn())
                | "CheckSourceChanges"
                >> beam.Map(check_source_changes, policy=spec.mode.changed_sources, version=appended_to.version)
            )
            summary = summary | "OfTheAppend" >> beam.Map(_append_summary, beam.pvalue.AsSingleton(changes))
            # Through the check's result, so that no shard is converted before an append is refused.
            shards = shards | "AfterSourceCheck" >> beam.Map(lambda shard, _: shard, beam.pvalue.AsSingleton(changes))
        return {
            SHARDS: shards,
            PLAN_DEAD_LETTERS: planned[PLAN_DEAD_LETTERS],
            PLAN_DEAD_REASONS: planned[PLAN_DEAD_REASONS],  # (reason, count)
            PLAN_SUMMARY: summary,
            IGNORED_COUNTS: planned[IGNORED_COUNTS],  # (Ignored kind, count)
        }


def _split_groups(spec: ConversionSpec) -> dict | None:
    """The groups PlanShards looks for: those asked for by flags, and for input lists and rows
    always the group column's (empty when the list has none); None: no grouping step at all."""
    settings = spec.splits.group_settings(grey=spec.image.channels == 1)
    if settings is None and spec.source.kind in ("list", "rows"):
        return {}
    return settings


def _label_lineage(output_dir: str, expected: Current | None, relabel: str) -> tuple[str, ...]:
    """The label names whose ids this run keeps, in id order (rules.label_lineage): none for a first
    version, or with --relabel sorted."""
    if relabel == "sorted" or expected is None or expected.manifest is None:
        return ()
    try:
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


class WritePlanOnly(beam.PTransform):
    """With --plan_only: the plan's dead letters and plan.json, beside whatever the folder holds."""

    def __init__(self, spec: ConversionSpec, settings: dict) -> None:
        super().__init__()
        self._output_dir = spec.output_dir
        self._max_bad_fraction = spec.limits.max_bad_fraction
        self._settings = settings

    @no_annotations
    def expand(self, planned: dict[str, beam.PCollection]) -> beam.PCollection:
        parts = (
            planned[PLAN_DEAD_LETTERS]
            | "KeyPlanDeadLetters" >> beam.Map(lambda d: (dead_letter_part(d), d))
            | "GroupPlanDeadLetters" >> beam.GroupByKey()
            | "WritePlanDeadLetters"
            >> beam.Map(write_dead_letter_part, output_dir=self._output_dir, prefix="plan_dead_letters")
        )
        return (
            planned[PLAN_SUMMARY]
            | "WithIgnored"
            >> beam.Map(
                lambda plan, counts: {**plan, "ignored": dict(counts)}, beam.pvalue.AsList(planned[IGNORED_COUNTS])
            )
            | "WritePlan"
            >> beam.Map(
                write_plan,
                beam.pvalue.AsList(parts),
                output_dir=self._output_dir,
                settings=self._settings,
                max_bad_fraction=self._max_bad_fraction,
            )
        )


class ConvertShards(beam.PTransform):
    """Shard plans -> staged shards in the run's folder, each with its sidecar; the inputs that
    fail are dead letters, and each example's content key goes on for the duplicate report."""

    def __init__(self, spec: ConversionSpec, run: RunContext, settings: dict) -> None:
        super().__init__()
        self._spec = spec
        self._run = run
        self._settings = settings

    @no_annotations
    def expand(self, shards: beam.PCollection) -> dict[str, beam.PCollection]:
        spec, run, image = self._spec, self._run, self._spec.image
        appended_to = run.appended_to
        converted = (
            shards
            | "SpreadShards" >> beam.Reshuffle()
            | "ConvertShards"
            >> beam.ParDo(
                ConvertShardFn(
                    image,
                    _run_folder(spec, run),
                    run_fingerprint=run_fingerprint(image, self._settings),
                    resume=spec.mode.resume,
                    convert_threads=run.convert_threads,
                    run_id=run.run_id,
                    preprocessing={**image.to_json(), **self._settings},
                    made_for=run_made_for(appended_to.version if appended_to else None),
                )
            ).with_outputs(DEAD_LETTERS, CONTENT_KEYS, main="shards")
        )
        # shards: ShardResult(split, index, file, num_examples, bytes, sha256); dead_letters: DeadLetter;
        # content_keys: (sha256 of source bytes, (filename, label))
        return {
            CONVERTED: converted.shards,
            DEAD_LETTERS: converted[DEAD_LETTERS],
            CONTENT_KEYS: converted[CONTENT_KEYS],
        }


def _run_folder(spec: ConversionSpec, run: RunContext) -> str:
    """Everything the conversion writes goes into the run's own folder (run_folders.py)."""
    return spec.output_dir if run.run_id is None else run_dir(spec.output_dir, run.run_id)


class CommitRun(beam.PTransform):
    """The converted shards, the dead letters and the content duplicates -> the manifest, and the
    one commit of the new version (writing/finalize.py)."""

    def __init__(self, spec: ConversionSpec, run: RunContext, settings: dict) -> None:
        super().__init__()
        self._spec = spec
        self._run = run
        self._settings = settings

    @no_annotations
    def expand(self, parts: dict[str, beam.PCollection]) -> beam.PCollection:
        spec, run = self._spec, self._run
        folder = _run_folder(spec, run)
        summary = parts[PLAN_SUMMARY] | LOG_PLAN_STEP >> beam.Map(
            _log_plan,
            beam.pvalue.AsList(parts[PLAN_DEAD_REASONS]),
            beam.pvalue.AsList(parts[IGNORED_COUNTS]),
            output_dir=folder,
            run_id=run.run_id,
        )
        # An append groups its new examples with the version's own: identical bytes across
        # versions are reported as in one run (append.merge_appended merges the groups).
        content_keys = (
            (parts[CONTENT_KEYS], parts[HELD_KEYS]) | "WithHeldContentKeys" >> beam.Flatten()
            if HELD_KEYS in parts
            else parts[CONTENT_KEYS]
        )
        duplicates = (
            content_keys
            | "GroupByContent" >> beam.GroupByKey()
            # (sha256, [(filename, label), ...])
            | "DuplicateGroups" >> beam.FlatMap(_duplicate_groups)
            # {"sha256", "files", "labels", "conflicting_labels"} for groups of two or more
        )
        dead_parts = (
            (parts[PLAN_DEAD_LETTERS], parts[DEAD_LETTERS])
            | "AllDeadLetters" >> beam.Flatten()
            | "KeyDeadLetters" >> beam.Map(lambda d: (dead_letter_part(d), d))
            | "GroupDeadLetters" >> beam.GroupByKey()
            # (part, [DeadLetter, ...]): 1/DEAD_LETTER_PARTS of them each
            | "WriteDeadLetterParts" >> beam.Map(write_dead_letter_part, output_dir=folder)
            # {"part", "count", "by_reason"}
        )
        appended_to = run.appended_to
        # The commit runs once, on one element, with the shards' results as a side input (one small
        # record per shard): a ToList of them (CombineGlobally) would add a shuffle and its
        # default-value stages, which on Flink ran one after another after the last shard was
        # written (from the last shard to the commit: 1.4 s with them, 1.0-1.1 s without, 2,000
        # photos; docs/clusters.md).
        return (
            parts[CONVERTED].pipeline
            | "CommitOnce" >> beam.Create([None])
            | "WriteManifest"
            >> beam.Map(
                _finalize_once,
                beam.pvalue.AsList(parts[CONVERTED]),
                summary=beam.pvalue.AsSingleton(summary),
                dead_parts=beam.pvalue.AsList(dead_parts),
                content_duplicates=beam.pvalue.AsList(duplicates),
                output_dir=spec.output_dir,
                run=run.run_id,
                expected=run.expected,
                change_kind=run.change_kind,
                config=spec.image,
                settings=self._settings,
                max_bad_fraction=spec.limits.max_bad_fraction,
                keep_versions=spec.mode.keep_versions,
                run_id=run.run_id,
                base=appended_to.manifest if appended_to else None,
            )
            # dict: the dataset_info.json that was written
        )


def _finalize_once(_: None, results: list[ShardResult], **commit: Any) -> dict:
    """finalize_outputs on the shards' results, for the one element of CommitOnce."""
    return finalize_outputs(results, **commit)


def _duplicate_groups(keyed: tuple[str, Iterable[tuple[str, str]]]) -> list[dict]:
    return content_duplicate_groups([keyed])


def _log_plan(
    summary: dict, reasons: list | tuple, ignored: list | tuple = (), *, output_dir: str, run_id: str | None
) -> dict:
    """Logs the plan's line, and leaves it with the totals for the launching process's watcher.
    ``reasons`` holds (reason, count) of the plan's dead letters, ``ignored`` (Ignored kind, count)
    for the entries the listing left out on purpose."""
    by_reason = dict(reasons)
    line = "\n".join([plan_line(summary, by_reason) + ignored_note(dict(ignored)), *plan_warning_lines(summary)])
    _DETAILS.info("%s", line)
    if run_id is not None:
        write_progress_plan(output_dir, run_id, line=line, summary=summary)
    return summary


def _check_applied_to(spec: ConversionSpec, start: beam.pvalue.PBegin | beam.PCollection) -> None:
    """A rows spec goes on a PCollection of rows, any other on the pipeline itself: said here, in
    the user's terms, rather than as a type error from deep inside the listing."""
    on_rows = isinstance(start, beam.PCollection)
    if on_rows and spec.source.kind != "rows":
        raise TypeError(
            f"ConvertImages with a {spec.source.kind} source ({spec.source.where}) lists its own inputs: apply it to "
            "the pipeline (pipeline | ConvertImages(spec)); a PCollection of rows takes Source(rows_root=...)"
        )
    if not on_rows and spec.source.kind == "rows":
        raise TypeError(
            f"ConvertImages with Source(rows_root={spec.source.rows_root!r}) converts a PCollection of rows: apply "
            "it to one (rows | ConvertImages(spec)), or give the spec a root or an input_list to list by itself"
        )

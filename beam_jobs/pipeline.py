"""The conversion pipeline, ``run(argv)`` and the command-line entry point."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import re
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, WorkerOptions

from beam_jobs.config import ImageConfig, parse_image_size, parse_splits
from beam_jobs.convert import CONTENT_KEYS, DEAD_LETTERS, METRICS_NAMESPACE, ConvertShardFn, _read_source
from beam_jobs.discover import ListManifest, ListTree, normalize_root
from beam_jobs.errors import BadInputError
from beam_jobs.manifest import (
    DATASET_INFO,
    DEAD_LETTERS_FILE,
    TooManyBadInputsError,
    content_duplicate_groups,
    finalize_outputs,
    run_fingerprint,
)
from beam_jobs.options import ConversionOptions
from beam_jobs.paths import redact
from beam_jobs.storage import temp_name
from beam_jobs.plan import DatasetPlan, estimate_example_bytes, labels_from_tree, plan_dataset
from beam_jobs.records import DeadLetter, InputFile

__all__ = ["ConvertImages", "main", "run"]

_LOG = logging.getLogger("beam_jobs")
_SHARD_NAME = re.compile(r"^.+-\d{5}-of-\d{5}\.tfrecord$")


def _make_plan(listing: list, *, from_tree: bool, source: str, **plan_args) -> DatasetPlan:
    inputs = [item for item in listing if isinstance(item, InputFile)]
    dead = [item for item in listing if isinstance(item, DeadLetter)]
    if from_tree:
        inputs, layout_dead = labels_from_tree(inputs)
        dead += layout_dead
    if not inputs and not dead:
        raise ValueError(f"no image files found in {source}")
    return plan_dataset(inputs, dead_letters=dead, **plan_args)


def _with_content_hash(item, *, max_file_bytes: int):
    """For --dedup=content: the sha256 of each input's bytes, before planning (unreadable inputs
    keep None and are dead-lettered by the conversion as usual)."""
    if not isinstance(item, InputFile):
        return item
    try:
        data = _read_source(item, max_file_bytes)
    except BadInputError:
        return item
    return dataclasses.replace(item, content_sha256=hashlib.sha256(data).hexdigest())


def _duplicate_groups(keyed):
    return content_duplicate_groups([keyed])


def _shards_of(plan: DatasetPlan):
    return plan.shards


def _dead_letters_of(plan: DatasetPlan):
    return plan.dead_letters


class ConvertImages(beam.PTransform):
    """Lists, plans, converts and finalises: the whole job as one transform."""

    def __init__(self, *, input_root: str | None, manifest: str | None, output_dir: str,
                 image_config: ImageConfig, split_fractions: dict[str, float] | None,
                 num_shards: int | None, target_shard_bytes: int, max_bad_fraction: float,
                 settings: dict, dedup: str = "path", resume: bool = False,
                 allow_outside_root: bool = False) -> None:
        super().__init__()
        self._input_root = input_root
        self._manifest = manifest
        self._output_dir = output_dir
        self._config = image_config
        self._split_fractions = split_fractions
        self._num_shards = num_shards
        self._target_shard_bytes = target_shard_bytes
        self._max_bad_fraction = max_bad_fraction
        self._settings = settings
        self._dedup = dedup
        self._resume = resume
        self._allow_outside_root = allow_outside_root

    def expand(self, pipeline):
        config = self._config
        if self._input_root is not None:
            listing = pipeline | "ListTree" >> ListTree(self._input_root, allow_outside_root=self._allow_outside_root)
        else:
            listing = pipeline | "ListManifest" >> ListManifest(
                self._manifest, allow_outside_root=self._allow_outside_root)
        # InputFile | DeadLetter
        if self._dedup == "content":
            listing = (
                listing
                | "SpreadListing" >> beam.Reshuffle()
                | "HashContent" >> beam.Map(_with_content_hash, max_file_bytes=config.max_file_bytes)
                # InputFile(..., content_sha256) | DeadLetter
            )
        plan = (
            listing
            | "GatherListing" >> beam.combiners.ToList()
            | "PlanShards" >> beam.Map(
                _make_plan,
                from_tree=self._input_root is not None,
                source=self._input_root or self._manifest,
                split_fractions=self._split_fractions,
                num_shards=self._num_shards,
                example_bytes=estimate_example_bytes(
                    width=config.width, height=config.height, channels=config.channels, encoding=config.encoding
                ),
                target_shard_bytes=self._target_shard_bytes,
                dedup=self._dedup,
            )
        )
        # DatasetPlan (one element: label names, every ShardPlan, listing dead letters)
        converted = (
            plan
            | "ShardPlans" >> beam.FlatMap(_shards_of)
            # ShardPlan(split, index, num_shards, inputs)
            | "SpreadShards" >> beam.Reshuffle()
            | "ConvertShards" >> beam.ParDo(ConvertShardFn(
                config, self._output_dir, run_fingerprint=run_fingerprint(config, self._settings),
                resume=self._resume,
            )).with_outputs(DEAD_LETTERS, CONTENT_KEYS, main="shards")
        )
        # shards: ShardResult(split, index, file, num_examples, bytes, sha256); dead_letters: DeadLetter;
        # content_keys: (sha256 of source bytes, (filename, label))
        duplicates = (
            converted[CONTENT_KEYS]
            | "GroupByContent" >> beam.GroupByKey()
            # (sha256, [(filename, label), ...])
            | "DuplicateGroups" >> beam.FlatMap(_duplicate_groups)
            # {"sha256", "files", "labels", "conflicting_labels"} for groups of two or more
        )
        dead_letters = (
            plan | "PlanDeadLetters" >> beam.FlatMap(_dead_letters_of),
            converted[DEAD_LETTERS],
        ) | "AllDeadLetters" >> beam.Flatten()
        return (
            converted.shards
            | "GatherShards" >> beam.combiners.ToList()
            | "WriteManifest" >> beam.Map(
                finalize_outputs,
                plan=beam.pvalue.AsSingleton(plan),
                dead_letters=beam.pvalue.AsList(dead_letters),
                content_duplicates=beam.pvalue.AsList(duplicates),
                output_dir=self._output_dir,
                config=config,
                settings=self._settings,
                max_bad_fraction=self._max_bad_fraction,
            )
            # dict: the dataset_info.json that was written
        )


def _use_local_runner_by_default(options: PipelineOptions, argv: Sequence[str]) -> None:
    """With no --runner, run on all local cores with Beam's FnApiRunner in multi-processing mode.

    Beam's DirectRunner would first try to download the Prism runner binary, which fails offline.
    """
    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        return
    standard.runner = "FnApiRunner"
    direct = options.view_as(DirectOptions)
    given = " ".join(argv)
    if "--direct_running_mode" not in given:
        direct.direct_running_mode = "multi_processing"
    if "--direct_num_workers" not in given:
        direct.direct_num_workers = 0  # All cores.
    # Workers log our per-shard progress; Beam's own INFO chatter from every worker would bury it.
    worker = options.view_as(WorkerOptions)
    if "--default_sdk_harness_log_level" not in given:
        worker.default_sdk_harness_log_level = "WARNING"
    if "--sdk_harness_log_level_overrides" not in given:
        worker.sdk_harness_log_level_overrides = {"beam_jobs": "INFO"}


def _existing_fingerprints(names: dict[str, str]) -> set[str]:
    """The run fingerprints recorded by an earlier run's manifest, if any."""
    found = set()
    if DATASET_INFO in names:
        with FileSystems.open(names[DATASET_INFO]) as handle:
            try:
                found.add(json.loads(handle.read().decode("utf-8")).get("fingerprint", "unknown"))
            except ValueError:
                found.add("unreadable")
    return found


def _prepare_output_dir(output_dir: str, *, overwrite: bool, resume: bool, fingerprint: str) -> None:
    """Never mixes two datasets in one folder.

    - --overwrite: everything the job writes is deleted first.
    - --resume: allowed when the folder holds this same run (same fingerprint) or an interrupted
      one; each staged shard is verified later against its sidecar, and stale files are removed.
    - neither: the folder must hold no dataset files at all.
    """
    try:
        if not FileSystems.exists(output_dir):
            FileSystems.mkdirs(output_dir)
        # Fail now, with a clear message, rather than after converting everything.
        probe = FileSystems.join(output_dir, temp_name("probe"))
        FileSystems.create(probe).close()
        FileSystems.delete([probe])
    except Exception as error:
        raise ValueError(f"cannot write to --output_dir {output_dir}: {error}") from None
    matches = FileSystems.match([FileSystems.join(output_dir, "*")])[0].metadata_list
    names = {m.path.rsplit("/", 1)[-1]: m.path for m in matches}
    ours = sorted(name for name in names
                  if _SHARD_NAME.match(name) or name in (DATASET_INFO, DEAD_LETTERS_FILE)
                  or name.startswith((".staged-", ".tmp-")))
    if not ours:
        return
    if overwrite:
        FileSystems.delete([names[name] for name in ours])
        return
    if resume:
        previous = _existing_fingerprints(names)
        if previous and previous != {fingerprint}:
            raise ValueError(
                f"--output_dir {output_dir} holds a dataset made with other settings; --resume only continues "
                "a run with the same flags. Pass --overwrite to replace it, or choose another folder"
            )
        _remove_temp_files(output_dir)
        return
    raise ValueError(
        f"--output_dir {output_dir} already holds dataset files ({len(ours)}, e.g. {ours[0]}); pass --resume "
        "to continue an interrupted run with the same flags, --overwrite to replace it, or choose another folder"
    )


def _remove_temp_files(output_dir: str) -> None:
    """Deletes temp files of killed writers; shards and their sidecars stay for verification."""
    matches = FileSystems.match([FileSystems.join(output_dir, ".tmp-*")])[0].metadata_list
    if matches:
        FileSystems.delete([m.path for m in matches])


def _help_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="images-to-tfrecords",
        description="Convert a folder tree or manifest of images into deterministic, sharded TFRecords "
        "of tf.train.Example, with dataset_info.json and dead_letters.jsonl.",
        epilog="Standard Beam flags pass through, e.g. --runner=DataflowRunner or --runner=FlinkRunner. "
        "With no --runner the job runs on all local cores (FnApiRunner, multi_processing).",
    )
    ConversionOptions._add_argparse_args(parser)  # pylint: disable=protected-access
    StandardOptions._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


def run(argv: Sequence[str] | None = None) -> dict:
    """Runs the job and returns the dataset_info.json it wrote. The only place that reads argv."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _help_parser().print_help()
        raise SystemExit(0)
    options = PipelineOptions(argv)
    flags = options.view_as(ConversionOptions)
    if bool(flags.input) == bool(flags.manifest):
        raise ValueError("give exactly one of --input DIR_OR_URI and --manifest FILE")
    if not flags.output_dir:
        raise ValueError("--output_dir is required")
    if not 0.0 <= flags.max_bad_fraction <= 1.0:
        raise ValueError(f"--max_bad_fraction must be in [0, 1] (got {flags.max_bad_fraction!r})")
    if flags.num_shards < 0 or flags.target_shard_mb <= 0:
        raise ValueError(f"--num_shards must be >= 0 and --target_shard_mb > 0 "
                         f"(got {flags.num_shards!r}, {flags.target_shard_mb!r})")
    width, height = parse_image_size(flags.image_size)
    config = ImageConfig(
        width=width, height=height, channels=flags.channels, resize_mode=flags.resize_mode,
        encoding=flags.encoding, jpeg_quality=flags.jpeg_quality, max_pixels=flags.max_pixels,
        max_file_bytes=int(flags.max_file_mb * 2**20), isolation=flags.isolation,
        decode_timeout_s=flags.decode_timeout_s,
    )
    split_fractions = parse_splits(flags.splits) if flags.splits else None
    if flags.overwrite and flags.resume:
        raise ValueError("give at most one of --overwrite and --resume")
    output_dir = normalize_root(flags.output_dir).rstrip("/")
    settings = {"splits": split_fractions, "num_shards": flags.num_shards or None,
                "target_shard_mb": flags.target_shard_mb, "dedup": flags.dedup}
    _prepare_output_dir(output_dir, overwrite=flags.overwrite, resume=flags.resume,
                        fingerprint=run_fingerprint(config, settings))
    _use_local_runner_by_default(options, argv)
    _LOG.info("converting %s into %s", flags.input or flags.manifest, output_dir)
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | "ConvertImages" >> ConvertImages(
        input_root=flags.input, manifest=flags.manifest, output_dir=output_dir,
        image_config=config, split_fractions=split_fractions,
        num_shards=flags.num_shards or None, target_shard_bytes=int(flags.target_shard_mb * 2**20),
        max_bad_fraction=flags.max_bad_fraction, settings=settings, dedup=flags.dedup,
        resume=flags.resume, allow_outside_root=flags.allow_outside_root,
    )
    result = pipeline.run()
    result.wait_until_finish()
    _log_counters(result)
    with FileSystems.open(FileSystems.join(output_dir, DATASET_INFO)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def _log_counters(result) -> None:
    """Logs the job's Beam counters, the same figures a cluster runner's UI shows."""
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    except Exception:  # Some runners cannot report metrics; the job's outputs are what matter.
        return
    totals: dict[str, int] = {}
    for counter in counters:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + (counter.committed or 0)
    if totals:
        _LOG.info("counters: %s", ", ".join(f"{name}={value}" for name, value in sorted(totals.items())))


def _summary(info: dict, output_dir: str) -> str:
    splits = ", ".join(f"{name}: {s['num_examples']} examples in {s['num_shards']} shards"
                       for name, s in info["splits"].items())
    return (f"wrote {splits} to {output_dir}; {info['num_dead_letters']} inputs could not be used "
            f"(see {info['dead_letters_file']})")


_STORAGE_ERRORS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")


def _root_cause(error: BaseException) -> str | None:
    """Finds our own error's message, or a storage failure, inside a runner's wrapped exception."""
    text = redact(str(error))
    match = re.search(rf"{TooManyBadInputsError.__name__}: (.+)", text)
    if match:
        return match.group(1).strip()
    for needle in _STORAGE_ERRORS:
        if needle in text:
            where = re.search(rf"{re.escape(needle)}[^\n]*?: '([^']+)'", text)
            return f"could not write the output: {needle}" + (f" ({where.group(1)})" if where else "") + \
                "; no shard was left under a final name and no dataset_info.json was written"
    match = re.search(r"ValueError: (.+)", text)
    return match.group(1).strip() if match else None


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: clear one-line errors instead of runner tracebacks for known failures."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("beam_jobs").setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        # The bad-fraction refusal is an expected outcome with its own one-line message below;
        # the runner's copies of its traceback would only bury that line.
        handler.addFilter(lambda record: TooManyBadInputsError.__name__ not in record.getMessage())
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        info = run(argv)
    except ValueError as error:
        print(f"images-to-tfrecords: error: {redact(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as error:  # Runners wrap worker exceptions; surface ours plainly.
        cause = _root_cause(error)
        if cause is None:
            raise
        print(f"images-to-tfrecords: error: {cause}", file=sys.stderr)
        raise SystemExit(1) from None
    output_dir = PipelineOptions(argv).view_as(ConversionOptions).output_dir
    print(_summary(info, output_dir))

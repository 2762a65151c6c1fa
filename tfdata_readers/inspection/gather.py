"""Gathers what an inspection shows: the manifest's card, verified shards, class counts, dead
letters, and a reproducible sample of examples read through the reader, as training sees them.

Nothing here draws or renders; a problem with the dataset (a missing or corrupt shard, an old
manifest, no dead-letter file) becomes a note in the result rather than an exception, so that the
report can say what is wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import heapq
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tfdata_readers.checking.verification import verify
from tfdata_readers.pipeline import make_dataset
from tfdata_readers.sources import storage
from tfdata_readers.sources.classes import class_counts
from tfdata_readers.sources.manifest import DatasetInfo, read_manifest
from tfdata_readers.sources.records import tensorflow_reason

# The mask id of the converter's letterbox bars (--resize_mode pad): "ignore", not a class.
PAD_CLASS_ID = 255

__all__ = [
    "DeadLetterGroup",
    "Inspection",
    "SampleExample",
    "ShardRow",
    "SplitSample",
    "gather",
    "sample_score",
]

_BATCH = 64
# The (height, width) that images kept at their own sizes are shown at on the contact sheet.
SHEET_SIZE = (256, 256)


@dataclasses.dataclass(frozen=True)
class ShardRow:
    """One shard in the report's table; `problems` is empty when its bytes, sha256 and records verified."""

    split: str
    file: str
    num_examples: int
    bytes: int
    problems: tuple[str, ...]

    @property
    def verified(self) -> bool:
        """Whether the shard passed every check: the table marks it verified, and the exit status counts it."""
        return not self.problems


@dataclasses.dataclass(frozen=True)
class SampleExample:
    """One sampled example: its pixels as the reader yields them (uint8 HxWxC), and with
    `--augmented` its training view (the crop and flip of the first training epoch)."""

    label_id: int
    label: str
    filename: str
    key: str
    image: np.ndarray
    augmented: np.ndarray | None = None
    # Annotated datasets: each box as (class name, ymin, xmin, ymax, xmax) normalised, and the
    # semantic mask (uint8 H x W of class ids), as the reader yields them for evaluation.
    boxes: tuple[tuple[str, float, float, float, float], ...] = ()
    mask: np.ndarray | None = None
    augmented_boxes: tuple[tuple[str, float, float, float, float], ...] = ()  # ... of the training view
    augmented_mask: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class SplitSample:
    """The sample of one split, and why it is short or empty, if it is (`error`)."""

    split: str
    examples: tuple[SampleExample, ...]
    scanned: int
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class DeadLetterGroup:
    reason: str
    count: int
    first_uris: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Inspection:
    """Everything the report, the pictures and the text summary show."""

    data_dir: str
    info: DatasetInfo
    shards: tuple[ShardRow, ...]
    other_problems: tuple[str, ...]  # manifest, dead-letter file, unlisted shards
    class_counts: dict[str, dict[str, int]]  # split -> label name -> examples
    class_counts_source: str
    dead_letters: tuple[DeadLetterGroup, ...]
    dead_letters_note: str | None
    samples: dict[str, SplitSample]
    seed: int
    # A dataset made with split groups: its largest groups' members (group_sheets.with_largest_groups).
    groups: tuple[Any, ...] = ()

    @property
    def splits(self) -> list[str]:
        """The dataset's split names in sorted order, the order every part of the report lists them in."""
        return sorted(self.info.splits)


def sample_score(seed: int, key: str, filename: str) -> bytes:
    """The order a sample is drawn in: a hash of the seed and the example, so the same seed picks
    the same examples whatever order the records are read in."""
    return hashlib.sha256(f"{seed}\0{key}\0{filename}".encode()).digest()


def _shard_rows(info: DatasetInfo, data_dir: str) -> tuple[tuple[ShardRow, ...], tuple[str, ...]]:
    problems = verify(data_dir, version=info.version)
    by_path: dict[str, list[str]] = {}
    for problem in problems:
        by_path.setdefault(problem.path, []).append(problem.problem)
    rows = []
    listed = set()
    for name in sorted(info.splits):
        for shard in info.splits[name].shards:
            listed.add(shard.path)
            # The manifest's relative path: two runs' folders may hold shards of the same name.
            rows.append(
                ShardRow(
                    split=name,
                    file=shard.file or os.path.basename(shard.path),
                    num_examples=shard.num_examples,
                    bytes=shard.bytes,
                    problems=tuple(by_path.get(shard.path, ())),
                )
            )
    other = tuple(str(p) for p in problems if p.path not in listed)
    return tuple(rows), other


def _counted_from_shards(info: DatasetInfo, split: str) -> dict[str, int]:
    """Labels counted from the records, for a manifest that predates class counts (corrupt records
    and missing shards are skipped: the shard table reports them)."""
    counts = dict.fromkeys(info.label_names, 0)
    spec = {"image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    for shard in info.splits[split].shards:
        if not storage.exists(shard.path):
            continue
        with storage.local_copy(shard.path) as path:  # on S3 a temporary download
            labels = (
                tf.data.TFRecordDataset(path)
                .ignore_errors()
                .batch(1024)
                .map(lambda b: tf.io.parse_example(b, spec)["image/class/label"])
                .ignore_errors()
            )
            for batch in labels:
                for label, n in zip(*np.unique(batch.numpy(), return_counts=True), strict=True):
                    if 0 <= label < len(info.label_names):
                        counts[info.label_names[label]] += int(n)
    return counts


def _class_counts(info: DatasetInfo, data_dir: str) -> tuple[dict[str, dict[str, int]], str]:
    try:
        return (
            {
                split: {info.label_names[i]: n for i, n in class_counts(data_dir, split, version=info.version).items()}
                for split in sorted(info.splits)
            },
            "dataset_info.json",
        )
    except ValueError as error:
        note = f"counted from the shards: {error}"
    return {split: _counted_from_shards(info, split) for split in sorted(info.splits)}, note


def _dead_letters(info: DatasetInfo, data_dir: str, first: int) -> tuple[tuple[DeadLetterGroup, ...], str | None]:
    name = info.raw.get("dead_letters_file", "dead_letters.jsonl")
    path = os.path.join(data_dir, str(name))
    if not storage.exists(path):
        return (), f"{name} is missing"
    groups: dict[str, list] = {}
    bad_lines = 0
    for line in storage.read_bytes(path).decode("utf-8").splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            reason, uri = str(entry["reason"]), str(entry["uri"])
        except (ValueError, KeyError, TypeError):
            bad_lines += 1
            continue
        group = groups.setdefault(reason, [0, []])
        group[0] += 1
        if len(group[1]) < first:
            group[1].append(uri)
    ordered = sorted(groups.items(), key=lambda item: (-item[1][0], item[0]))
    note = f"{bad_lines} line(s) of {name} are not dead letters" if bad_lines else None
    return tuple(DeadLetterGroup(reason, n, tuple(uris)) for reason, (n, uris) in ordered), note


def _read_sample(
    data_dir: str,
    split: str,
    info: DatasetInfo,
    *,
    size: int,
    seed: int,
    scan: int,
    augmented: bool,
    skip_corrupt: bool,
    cache_dir: str | None = None,
) -> SplitSample:
    """The `size` examples with the smallest `sample_score` among the first `scan` records.

    The shards are hash-mixed samples of the split, so the first records are as good as any.
    Both views come from `make_dataset`: evaluation (the stored image), and with `augmented` the
    training path with `seed` in the same record order (no file or record shuffle), whose crop
    and flip are, by the reader's contract, those of the first training epoch with that seed.
    """
    options = _sample_read_options(info, skip_corrupt=skip_corrupt, cache_dir=cache_dir)
    chosen: list = []  # ((negated score, filename, n), example): a heap whose root is the worst kept
    scanned = 0
    error = None
    try:
        views = _sample_views(data_dir, split, options, seed=seed, augmented=augmented)
        for evaluation, training, i, key, filename in _records_of(views):
            if scanned >= scan:
                break
            scanned += 1
            rank = (_negate(sample_score(seed, key, filename)), filename, scanned)
            if len(chosen) < size or rank > chosen[0][0]:
                _keep(chosen, (rank, _sample_example(evaluation, training, i, key, filename, info)), size)
            if scanned >= scan:
                break  # before the next batch is read
    except (tf.errors.OpError, OSError, ValueError) as failure:
        error = f"{type(failure).__name__}: {tensorflow_reason(getattr(failure, 'message', None) or str(failure))}"
    examples = sorted((entry[1] for entry in chosen), key=lambda e: (e.label_id, e.filename))
    return SplitSample(split=split, examples=tuple(examples), scanned=scanned, error=error)


def _sample_read_options(info: DatasetInfo, *, skip_corrupt: bool, cache_dir: str | None) -> dict[str, Any]:
    """`make_dataset`'s options shared by both views: uint8 pixels and metadata, in a fixed order."""
    options: dict[str, Any] = dict(
        with_metadata=True, dtype="uint8", deterministic=True, skip_corrupt=skip_corrupt, version=info.version
    )
    if cache_dir is not None:
        options["cache_dir"] = cache_dir  # s3://: the reader reads its shards through a cache
    if info.image.keeps_size:
        options["image_size"] = SHEET_SIZE  # images of their own sizes: shown at one size, centre-cropped
    return options


def _sample_views(
    data_dir: str, split: str, options: dict[str, Any], *, seed: int, augmented: bool
) -> list[tf.data.Dataset]:
    """The evaluation view, and with `augmented` the training view read in the same record order."""
    views = [make_dataset(data_dir, split, _BATCH, **options)]
    if augmented:
        views.append(
            make_dataset(
                data_dir,
                split,
                _BATCH,
                training=True,
                seed=seed,
                shuffle_files=False,
                shuffle_buffer_size=1,
                drop_remainder=False,
                **options,
            )
        )
    return views


def _records_of(views: list[tf.data.Dataset]) -> Iterator[tuple[Any, Any, int, str, str]]:
    """(evaluation batch, training batch or None, index in the batch, key, filename) of each record.

    The two views must read the same records in the same order, or the sample would pair one
    example's stored image with another's training view: that is a ValueError.
    """
    for batches in zip(*views, strict=True):
        evaluation, training = batches[0], (batches[1] if len(views) > 1 else None)
        keys = [k.decode() for k in evaluation[2]["key"].numpy()]
        names = [f.decode() for f in evaluation[2]["filename"].numpy()]
        if training is not None and [k.decode() for k in training[2]["key"].numpy()] != keys:
            raise ValueError("the training view read the records in another order than the evaluation view")
        for i, (key, filename) in enumerate(zip(keys, names, strict=True)):
            yield evaluation, training, i, key, filename


def _sample_example(
    evaluation: Any, training: Any, i: int, key: str, filename: str, info: DatasetInfo
) -> SampleExample:
    """Record `i` of an (images, labels, metadata) batch, with its training view when there is one."""
    images, labels, meta = evaluation
    augmented_annotations = (
        {} if training is None else {f"augmented_{k}": v for k, v in _annotations_of(training[1], i, info).items()}
    )
    return SampleExample(
        **_label_of(labels, meta, i, info),
        **_annotations_of(labels, i, info),
        **augmented_annotations,
        filename=filename,
        key=key,
        image=images[i].numpy(),
        augmented=None if training is None else training[0][i].numpy(),
    )


def _keep(chosen: list, entry: tuple, size: int) -> None:
    """Adds `entry` to the heap `chosen`, pushing out its worst once it holds `size`."""
    if len(chosen) < size:
        heapq.heappush(chosen, entry)
    else:
        heapq.heapreplace(chosen, entry)


def _label_of(labels: Any, meta: dict, i: int, info: DatasetInfo) -> dict[str, Any]:
    """The label_id and label text a tile shows: an annotated example's classes joined with "+"
    (its first class's id; -1 for none)."""
    if info.task == "classification":
        return {"label_id": int(labels[i]), "label": meta["label_text"][i].numpy().decode()}
    if info.task == "segmentation":
        # Its labels are its mask, whose ids are the user's own numbers: the tile names the ids it
        # holds (255 is the padding's "ignore").
        ids = [int(v) for v in np.unique(labels[i].numpy()) if v != PAD_CLASS_ID]
        return {"label_id": ids[0] if ids else -1, "label": "mask ids " + "+".join(map(str, ids)) if ids else "(none)"}
    hot = (labels["labels"] if isinstance(labels, dict) else labels)[i].numpy()
    ids = [index for index, value in enumerate(hot) if value > 0]
    return {"label_id": ids[0] if ids else -1, "label": "+".join(info.label_names[j] for j in ids) or "(none)"}


def _annotations_of(targets: Any, i: int, info: DatasetInfo) -> dict[str, Any]:
    """The boxes and mask a tile draws over an annotated example (none for other datasets)."""
    if not isinstance(targets, dict) and info.task != "segmentation":
        return {}
    if info.task == "segmentation":
        return {"mask": targets[i].numpy()[..., 0]}
    boxes = tuple(
        (info.label_names[int(cls)], *map(float, box))
        for box, cls in zip(targets["boxes"][i].numpy(), targets["classes"][i].numpy(), strict=True)
        if cls >= 0
    )
    mask = targets["mask"][i].numpy()[..., 0] if "mask" in targets else None
    if mask is None and "masks" in targets:
        # Instance masks, tinted by their object's class (id + 1: 0 is left untinted), later
        # objects over earlier ones.
        mask = np.zeros(targets["masks"].shape[2:], np.uint8)
        for instance, cls in zip(targets["masks"][i].numpy(), targets["classes"][i].numpy(), strict=True):
            if cls >= 0:
                mask[instance > 0] = min(int(cls) + 1, PAD_CLASS_ID - 1)
    return {"boxes": boxes, "mask": mask}


def _negate(score: bytes) -> bytes:
    """Byte-wise complement: heapq keeps a min-heap, and the sample keeps the smallest scores."""
    return bytes(255 - b for b in score)


def gather(
    data_dir: str | os.PathLike[str],
    *,
    num_examples: int = 64,
    seed: int = 0,
    augmented: bool = False,
    scan: int = 4096,
    first_dead_letters: int = 5,
    splits: list[str] | None = None,
    version: int | None = None,
) -> Inspection:
    """Reads everything the inspection shows, of `version` (None: the current one, resolved once
    here, so every part of the report shows the same version). Raises only when there is no
    manifest to read."""
    data_dir = os.fspath(data_dir)
    if "://" not in data_dir:
        data_dir = os.path.abspath(data_dir)  # the report names where the dataset is, wherever it is opened
    info, _ = read_manifest(data_dir, version)  # its structural problems come back from verify(), as other problems
    unknown = [split for split in splits or () if split not in info.splits]
    if unknown:  # Before any shard is read.
        raise ValueError(f"split {unknown[0]!r} is not in {info.manifest_path}; expected one of {sorted(info.splits)}")
    shards, other = _shard_rows(info, data_dir)
    counts, source = _class_counts(info, data_dir)
    dead, dead_note = _dead_letters(info, data_dir, first_dead_letters)
    damaged = {row.split for row in shards if not row.verified}
    samples = {}
    with contextlib.ExitStack() as stack:
        # On S3 the sample is read through a shard cache of its own, removed with the inspection.
        cache_dir = stack.enter_context(tempfile.TemporaryDirectory()) if storage.is_s3(data_dir) else None
        for split in splits or sorted(info.splits):
            samples[split] = _read_sample(
                data_dir,
                split,
                info,
                size=num_examples,
                seed=seed,
                scan=scan,
                augmented=augmented,
                skip_corrupt=split in damaged,
                cache_dir=cache_dir,
            )
    return Inspection(
        data_dir=data_dir,
        info=info,
        shards=shards,
        other_problems=other,
        class_counts=counts,
        class_counts_source=source,
        dead_letters=dead,
        dead_letters_note=dead_note,
        samples=samples,
        seed=seed,
    )

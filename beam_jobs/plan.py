"""Pure, deterministic planning: labels, splits, and which input goes to which shard in what order."""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from beam_jobs.errors import Reason, Stage
from beam_jobs.names import is_valid_split_name
from beam_jobs.records import DeadLetter, InputFile

__all__ = [
    "DEDUP_POLICIES",
    "DEFAULT_TARGET_SHARD_MB",
    "DatasetPlan",
    "ShardPlan",
    "assign_splits",
    "estimate_example_bytes",
    "labels_from_tree",
    "plan_dataset",
    "plan_num_shards",
    "shard_file_name",
    "stable_fraction",
]

DEFAULT_TARGET_SHARD_MB = 150
# Enough shards to keep a cluster's workers (and a reader's interleave) busy, but never so many
# that a shard holds fewer than MIN_EXAMPLES_PER_SHARD examples.
MIN_PARALLEL_SHARDS = 32
MIN_EXAMPLES_PER_SHARD = 64
DEFAULT_SPLIT = "train"
TREE_LAYOUTS = ("auto", "label", "split_label")
# Top folder names that "auto" reads as splits in a ROOT/<split>/<label>/<image> tree; any other
# name makes the three-level tree ambiguous (ROOT/<label>/<year>/<image> is common too).
KNOWN_SPLIT_NAMES = frozenset({"train", "training", "validation", "valid", "val", "dev", "test", "testing",
                               "eval", "evaluation", "holdout", "calibration"})

# Rough bytes per pixel-channel of encoded photos, to turn --target_shard_mb into a shard count
# before anything is encoded. Measured on the sample photos at 224 px: JPEG q95 ~0.2, PNG ~0.6.
_BYTES_PER_VALUE = {"jpeg": 0.2, "png": 0.6, "raw": 1.0}
_RECORD_OVERHEAD_BYTES = 300  # Other features, proto and TFRecord framing.


def _digest(purpose: str, filename: str) -> bytes:
    # Each purpose gets its own salt, so that split and shard assignments are independent.
    return hashlib.sha256(f"{purpose}\0{filename}".encode("utf-8")).digest()


def stable_fraction(filename: str, purpose: str = "split") -> float:
    """A number in [0, 1) fixed by the filename alone: the same on every run, machine and runner."""
    return int.from_bytes(_digest(purpose, filename)[:8], "big") / 2**64


def shard_file_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


@dataclass(frozen=True)
class ShardPlan:
    """One unit of work: the inputs of one shard, in the order they are written."""

    split: str
    index: int
    num_shards: int
    inputs: tuple[InputFile, ...]

    @property
    def file_name(self) -> str:
        return shard_file_name(self.split, self.index, self.num_shards)


@dataclass(frozen=True)
class DatasetPlan:
    """The whole job's plan; small, since it holds paths and never pixels."""

    label_names: tuple[str, ...]
    shards: tuple[ShardPlan, ...]
    num_inputs: int
    dead_letters: tuple[DeadLetter, ...] = field(default=())

    def num_shards(self, split: str) -> int:
        return sum(1 for shard in self.shards if shard.split == split)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(sorted({shard.split for shard in self.shards}))


def input_order(f: InputFile) -> tuple:
    """A total order of inputs by explicit keys: their optional fields may be None, which does not
    compare with a string, so the dataclass's own ordering cannot be used."""
    return (f.filename, f.uri, f.label or "", f.split or "", -1 if f.size is None else f.size,
            f.content_sha256 or "", f.label_id, -1.0 if f.mtime is None else f.mtime, f.origin or "")


def tree_reads_splits(depths: Iterable[int], tops: Iterable[str], layout: str) -> bool:
    """Whether a tree is read as ``<split>/<label>/<image>``, from the depths of its images and the
    top folders of its three-level images: facts small enough to gather from any tree.

    "auto" reads splits only when every image is three levels deep and every top folder is named
    like a split (train, validation, test, ...): a tree like ``<label>/<year>/<image>`` must not
    silently become splits named after labels.
    """
    if layout not in TREE_LAYOUTS:
        raise ValueError(f"tree layout must be one of {TREE_LAYOUTS} (got {layout!r})")
    if layout != "auto":
        return layout == "split_label"
    return set(depths) == {3} and all(top.lower() in KNOWN_SPLIT_NAMES for top in tops)


def label_from_tree(f: InputFile, *, with_split: bool, depths: Iterable[int], tops: Iterable[str],
                    ) -> InputFile | DeadLetter:
    """One tree input labelled by the decided layout, or a dead letter that says why it does not fit."""
    parts = f.filename.split("/")
    if with_split and len(parts) == 3 and is_valid_split_name(parts[0]):
        return replace(f, split=parts[0], label=parts[1])
    if not with_split and len(parts) == 2:
        return replace(f, label=parts[0])
    if with_split and len(parts) == 3:
        why = f"the folder {parts[0]!r} cannot name a split (letters, digits, '_' and '-' only)"
    elif not with_split and set(depths) == {3} and tops and all(t.lower() in KNOWN_SPLIT_NAMES for t in tops):
        why = (f"--tree_layout label expects <label>/<image>, but this image is three levels deep "
               f"(got {f.filename!r})")
    elif not with_split and set(depths) == {3}:
        shown = ", ".join(map(repr, sorted(tops)[:5]))
        why = (f"every image is three levels deep, but the top folders ({shown}) are not split names; "
               "pass --tree_layout split_label to read them as <split>/<label>/<image>")
    else:
        expected = "<split>/<label>/<image>" if with_split else "<label>/<image> or <split>/<label>/<image>"
        why = f"expected {expected} under the input root (got {f.filename!r})"
    return DeadLetter(f.uri, Stage.LIST, Reason.UNEXPECTED_LAYOUT, why)


def tree_facts(files: Iterable[InputFile]) -> tuple[set[int], set[str]]:
    """(depths of the images, top folders of the three-level images)."""
    depths, tops = set(), set()
    for f in files:
        parts = f.filename.split("/")
        depths.add(len(parts))
        if len(parts) == 3:
            tops.add(parts[0])
    return depths, tops


def labels_from_tree(files: Iterable[InputFile], layout: str = "auto") -> tuple[list[InputFile], list[DeadLetter]]:
    """Labels tree inputs from their folders: ``<label>/<image>`` or ``<split>/<label>/<image>``,
    the layout decided for the whole tree (see tree_reads_splits)."""
    files = sorted(files, key=input_order)
    depths, tops = tree_facts(files)
    with_split = tree_reads_splits(depths, tops, layout)
    labelled, dead = [], []
    for f in files:
        item = label_from_tree(f, with_split=with_split, depths=depths, tops=tops)
        (dead if isinstance(item, DeadLetter) else labelled).append(item)
    return labelled, dead


def assign_splits(files: Iterable[InputFile], fractions: Mapping[str, float]) -> list[InputFile]:
    """Gives each input without a split one, by a stable hash of its filename."""
    names = list(fractions)
    bounds = []
    total = 0.0
    for name in names:
        total += fractions[name]
        bounds.append(total)
    result = []
    for f in files:
        if f.split is None:
            position = stable_fraction(f.filename, "split") * total
            split = next((n for n, bound in zip(names, bounds) if position < bound), names[-1])
            f = replace(f, split=split)
        result.append(f)
    return result


def estimate_example_bytes(*, width: int, height: int, channels: int, encoding: str) -> int:
    return int(width * height * channels * _BYTES_PER_VALUE[encoding]) + _RECORD_OVERHEAD_BYTES


def plan_num_shards(num_examples: int, *, example_bytes: int, target_shard_bytes: int) -> int:
    """Shards of about ``target_shard_bytes``, yet at least min(32, n/64) so many workers can help."""
    if num_examples <= 0:
        return 0
    by_size = math.ceil(num_examples * example_bytes / target_shard_bytes)
    by_parallelism = min(MIN_PARALLEL_SHARDS, num_examples // MIN_EXAMPLES_PER_SHARD)
    return max(1, by_size, by_parallelism)


DEDUP_POLICIES = ("path", "content")


def resolve_same_path(filename: str, rows: Iterable[InputFile]) -> tuple[InputFile | None, list[DeadLetter]]:
    """The input kept among the rows that name one relative path, and dead letters for the rest.

    The same path listed twice with the same label is one input, and the other rows are dropped (a
    row that names a split wins over one that leaves it blank). Listed with different labels, or
    two different splits, all its rows are refused: which is meant is not known.
    """
    rows = sorted(rows, key=input_order)
    if len(rows) == 1:
        return rows[0], []
    labels = {f.label or "" for f in rows}
    splits = {f.split for f in rows if f.split}
    if len(labels) > 1 or len(splits) > 1:
        shown = ", ".join(f"label {f.label!r} split {f.split or '(none)'!r}" + (f" at {f.origin}" if f.origin else "")
                          for f in rows)
        return None, [DeadLetter(f.uri, Stage.LIST, Reason.CONFLICTING_LABELS,
                                 f"{filename!r} is listed {len(rows)} times with different labels or splits: "
                                 f"{shown}" + (f" (this row: {f.origin})" if f.origin else ""))
                      for f in rows]
    first = next((f for f in rows if f.split), rows[0])
    where = f" (kept {first.origin})" if first.origin else ""
    return first, [DeadLetter(f.uri, Stage.LIST, Reason.DUPLICATE_INPUT,
                              f"{filename!r} is listed more than once" + (f"; this row: {f.origin}" if f.origin else "")
                              + where)
                   for f in rows if f is not first]


def resolve_same_content(sha256: str, group: Iterable[InputFile]) -> tuple[list[InputFile], list[DeadLetter]]:
    """Inputs with identical bytes are one input: the first filename in sorted order is kept. If
    their labels disagree, none is kept, since the label is ambiguous."""
    group = sorted(group, key=input_order)
    if len(group) < 2:
        return group, []
    labels = sorted({f.label or "" for f in group})
    names = ", ".join(repr(f.filename) for f in group)
    if len(labels) > 1:
        return [], [DeadLetter(f.uri, Stage.LIST, Reason.CONFLICTING_LABELS,
                               f"the same bytes (sha256 {sha256[:16]}...) are labelled {labels!r}: {names}")
                    for f in group]
    return group[:1], [DeadLetter(f.uri, Stage.LIST, Reason.DUPLICATE_CONTENT,
                                  f"same bytes as {group[0].filename!r} (kept)") for f in group[1:]]


def _drop_duplicates(files: Sequence[InputFile], dedup: str) -> tuple[list[InputFile], list[DeadLetter]]:
    """Applies the --dedup policy in memory (the job does the same with GroupByKey): every input
    dropped becomes a dead letter saying why. See resolve_same_path and resolve_same_content."""
    if dedup not in DEDUP_POLICIES:
        raise ValueError(f"dedup must be one of {DEDUP_POLICIES} (got {dedup!r})")
    by_path: dict[str, list[InputFile]] = defaultdict(list)
    for f in files:
        by_path[f.filename].append(f)
    kept, dead = [], []
    for filename in sorted(by_path):
        first, dropped = resolve_same_path(filename, by_path[filename])
        kept += [first] if first is not None else []
        dead += dropped
    if dedup == "content":
        by_content: dict[str, list[InputFile]] = defaultdict(list)
        unhashed = []
        for f in kept:
            (by_content[f.content_sha256] if f.content_sha256 is not None else unhashed).append(f)
        kept = list(unhashed)
        for sha256 in sorted(by_content):
            survivors, dropped = resolve_same_content(sha256, by_content[sha256])
            kept += survivors
            dead += dropped
    return kept, dead


# Planning at cluster scale: each input's place follows from its own hash plus O(buckets) counts.
# The first 12 bits of the shard digest pick one of 4096 buckets per split; a bucket's offset is
# the number of inputs of its split in lower buckets, so offset + rank inside the bucket is the
# input's rank in the split's global hash order, as if the whole split had been sorted.
BUCKET_BITS = 12
NUM_BUCKETS = 1 << BUCKET_BITS


def shard_digest(filename: str) -> bytes:
    """The hash that orders a split's inputs (and so deals them to shards)."""
    return _digest("shard", filename)


def bucket_of(digest: bytes) -> int:
    """The hash-prefix bucket of a shard digest: buckets in ascending order follow the digests."""
    return int.from_bytes(digest[:2], "big") >> (16 - BUCKET_BITS)


def bucket_offsets(counts: Mapping[int, int]) -> dict[int, int]:
    """{bucket: number of inputs in lower buckets} for the buckets that hold any input."""
    offsets, total = {}, 0
    for bucket in sorted(counts):
        offsets[bucket] = total
        total += counts[bucket]
    return offsets


def place_in_shard(rank: int, num_shards: int) -> tuple[int, int]:
    """(shard index, position in the shard) of the input at ``rank`` in its split's hash order:
    round-robin dealing, so shard sizes differ by at most one and each shard is a hash-mixed sample."""
    if num_shards < 1 or rank < 0:
        raise ValueError(f"need rank >= 0 and num_shards >= 1 (got {rank!r}, {num_shards!r})")
    return rank % num_shards, rank // num_shards


def split_shard_count(num_examples: int, *, num_shards: int | None, example_bytes: int,
                      target_shard_bytes: int) -> int:
    """Shards of one split: --num_shards, or derived from the size, and never more than inputs."""
    count = num_shards or plan_num_shards(num_examples, example_bytes=example_bytes,
                                          target_shard_bytes=target_shard_bytes)
    return min(count, num_examples)


def plan_dataset(
    files: Iterable[InputFile],
    *,
    split_fractions: Mapping[str, float] | None = None,
    num_shards: int | None = None,
    example_bytes: int,
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_MB * 1024 * 1024,
    dead_letters: Sequence[DeadLetter] = (),
    dedup: str = "path",
) -> DatasetPlan:
    """Plans every shard of every split.

    Within a split, inputs are sorted by a hash of their filename and dealt round-robin to the
    shards, so shard sizes differ by at most one example, every shard is a random-looking mix of
    classes, and the order inside a shard is by hash too. Everything depends on the filenames
    alone, never on listing order, runner or parallelism.
    """
    files, duplicates = _drop_duplicates(list(files), dedup)
    files = assign_splits(files, split_fractions or {DEFAULT_SPLIT: 1.0})
    label_names = tuple(sorted({f.label for f in files if f.label is not None}))
    label_ids = {name: index for index, name in enumerate(label_names)}
    by_split: dict[str, list[InputFile]] = defaultdict(list)
    for f in files:
        by_split[f.split].append(replace(f, label_id=label_ids[f.label]))
    shards = []
    for split in sorted(by_split):
        members = sorted(by_split[split], key=lambda f: shard_digest(f.filename))
        count = split_shard_count(len(members), num_shards=num_shards, example_bytes=example_bytes,
                                  target_shard_bytes=target_shard_bytes)
        for index in range(count):
            shards.append(ShardPlan(split, index, count, tuple(members[index::count])))
    return DatasetPlan(
        label_names=label_names,
        shards=tuple(shards),
        num_inputs=len(files) + len(duplicates) + len(dead_letters),
        dead_letters=tuple(sorted([*dead_letters, *duplicates])),
    )

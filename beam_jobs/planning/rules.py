"""Pure, deterministic planning: labels, splits, and which input goes to which shard in what order."""

from __future__ import annotations

import math
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from beam_jobs.errors import BadInputError, Reason, Stage
from beam_jobs.listing.names import clean_label, clean_split_name, is_valid_split_name  # noqa: F401 (discover imports it from here)
from beam_jobs.planning.hashing import (  # noqa: F401 (imported from here too)
    BUCKET_BITS,
    NUM_BUCKETS,
    _digest,
    bucket_of,
    bucket_offsets,
    shard_digest,
    stable_fraction,
)
from beam_jobs.planning.label_rules import (  # noqa: F401 (imported from here too)
    RELABEL_CHOICES,
    _label_map_line,
    _labels_with_ids,
    label_id_changes,
    label_lineage,
    ordered_label_names,
    with_label_map,
)
from beam_jobs.planning.plan_warnings import (  # noqa: F401 (imported from here too)
    _DECIMAL,
    _first_label_out_of_numeric_order,
    _shown,
    plan_warnings,
)
from beam_jobs.planning.split_rules import (  # noqa: F401 (imported from here too)
    DEFAULT_SPLIT_RULE,
    SPLIT_RULES,
    _cell_tie,
    _exact_shares,
    assign_splits,
    assign_splits_by_hash,
    assign_splits_stratified,
    split_at_rank,
    split_bucket_key,
    split_digest,
    split_order,
    split_quotas,
    stratified_counts,
)
from beam_jobs.records import DeadLetter, InputFile, class_names

__all__ = [
    "DEDUP_POLICIES",
    "DEFAULT_SPLIT_RULE",
    "DEFAULT_TARGET_SHARD_MB",
    "RELABEL_CHOICES",
    "SPLIT_RULES",
    "DatasetPlan",
    "ShardPlan",
    "assign_splits",
    "assign_splits_by_hash",
    "assign_splits_stratified",
    "label_id_changes",
    "label_lineage",
    "merged_split_folders",
    "ordered_label_names",
    "plan_warnings",
    "split_quotas",
    "stratified_counts",
    "estimate_example_bytes",
    "labels_from_tree",
    "plan_dataset",
    "plan_num_shards",
    "shard_file_name",
    "stable_fraction",
    "with_label_map",
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
KNOWN_SPLIT_NAMES = frozenset(
    {
        "train",
        "training",
        "validation",
        "valid",
        "val",
        "dev",
        "test",
        "testing",
        "eval",
        "evaluation",
        "holdout",
        "calibration",
    }
)

# Rough bytes per pixel-channel of encoded photos, to turn --target_shard_mb into a shard count
# before anything is encoded. Measured on the sample photos at 224 px: JPEG q95 ~0.2, PNG ~0.6.
_BYTES_PER_VALUE = {"jpeg": 0.2, "png": 0.6, "raw": 1.0}
_RECORD_OVERHEAD_BYTES = 300  # Other features, proto and TFRecord framing.


def shard_file_name(split: str, index: int, num_shards: int) -> str:
    """The shard's name, "<split>-SSSSS-of-NNNNN.tfrecord": it tells readers its split and how many shards that has."""
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
        """The shard's file name in the output folder, from its split, index and the split's shard count."""
        return shard_file_name(self.split, self.index, self.num_shards)


@dataclass(frozen=True)
class DatasetPlan:
    """The whole job's plan; small, since it holds paths and never pixels."""

    label_names: tuple[str, ...]
    shards: tuple[ShardPlan, ...]
    num_inputs: int
    dead_letters: tuple[DeadLetter, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    def num_shards(self, split: str) -> int:
        """How many shards the plan gives ``split`` (0 for a split it does not have)."""
        return sum(1 for shard in self.shards if shard.split == split)

    @property
    def split_names(self) -> tuple[str, ...]:
        """The splits that have at least one shard, sorted."""
        return tuple(sorted({shard.split for shard in self.shards}))


def input_order(f: InputFile) -> tuple:
    """A total order of inputs by explicit keys: their optional fields may be None, which does not
    compare with a string, so the dataclass's own ordering cannot be used."""
    return (
        f.filename,
        f.uri,
        f.label or "",
        f.split or "",
        -1 if f.size is None else f.size,
        f.content_sha256 or "",
        f.label_id,
        -1.0 if f.mtime is None else f.mtime,
        f.origin or "",
        repr(f.annotations),
    )


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
    return set(depths) == {3} and all(_split_key(top) in KNOWN_SPLIT_NAMES for top in tops)


def _split_key(name: str) -> str:
    """A top folder's name as a split would read it, to recognise ``Validation`` or ``TRAIN``."""
    return unicodedata.normalize("NFC", name).strip().lower()


def _names_from_tree(f: InputFile, split_folder: str | None, label_folder: str) -> InputFile:
    """``f`` with its split and label read from folder names by the one naming policy
    (beam_jobs.listing.names), so a tree names classes exactly as an input list does; raises
    BadInputError naming the file for a folder that cannot be a label or a split."""
    where = repr(f.filename)
    label = clean_label(label_folder, where=where)
    split = None if split_folder is None else clean_split_name(split_folder, where=where)
    return replace(f, split=split, label=label)


def label_from_tree(
    f: InputFile,
    *,
    with_split: bool,
    depths: Iterable[int],
    tops: Iterable[str],
) -> InputFile | DeadLetter:
    """One tree input labelled by the decided layout, or a dead letter that says why it does not fit."""
    parts = f.filename.split("/")
    try:
        if with_split and len(parts) == 3:
            return _names_from_tree(f, parts[0], parts[1])
        if not with_split and len(parts) == 2:
            return _names_from_tree(f, None, parts[0])
    except BadInputError as error:
        return DeadLetter(f.uri, error.stage, error.reason, error.detail)
    if not with_split and set(depths) == {3} and tops and all(_split_key(t) in KNOWN_SPLIT_NAMES for t in tops):
        why = f"--tree_layout label expects <label>/<image>, but this image is three levels deep (got {f.filename!r})"
    elif not with_split and set(depths) == {3}:
        shown = ", ".join(map(repr, sorted(tops)[:5]))
        why = (
            f"every image is three levels deep, but the top folders ({shown}) are not split names; "
            "pass --tree_layout split_label to read them as <split>/<label>/<image>"
        )
    else:
        expected = "<split>/<label>/<image>" if with_split else "<label>/<image> or <split>/<label>/<image>"
        why = f"expected {expected} under the input root (got {f.filename!r})"
    return DeadLetter(f.uri, Stage.LIST, Reason.UNEXPECTED_LAYOUT, why)


def merged_split_folders(tops: Iterable[str]) -> dict[str, list[str]]:
    """{split: [its top folders]} for the splits that several top folders name (``validation/``
    and ``Validation/``): they are one split, since split names are lower case (see
    names.clean_split_name); the plan says so, so that the merge is never a surprise."""
    by_split: dict[str, set[str]] = defaultdict(set)
    for top in tops:
        try:
            by_split[clean_split_name(top, where=repr(top))].add(top)
        except BadInputError:
            continue  # Its images are dead letters that name the folder.
    return {split: sorted(folders) for split, folders in sorted(by_split.items()) if len(folders) > 1}


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
    labelled: list[InputFile] = []
    dead: list[DeadLetter] = []
    for f in files:
        item = label_from_tree(f, with_split=with_split, depths=depths, tops=tops)
        if isinstance(item, DeadLetter):
            dead.append(item)
        else:
            labelled.append(item)
    return labelled, dead


def estimate_example_bytes(*, width: int, height: int, channels: int, encoding: str) -> int:
    """A serialised Example's likely size, so that shards can be counted before anything is encoded."""
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
    # Labels and annotations: two rows that annotate one image differently conflict as two labels do.
    labels = {f.label or "" for f in rows}
    annotations = {f.annotations.content() if f.annotations else None for f in rows}
    splits = {f.split for f in rows if f.split}
    if len(labels) > 1 or len(annotations) > 1 or len(splits) > 1:
        differ = [
            what
            for what, values in (("labels", labels), ("annotations", annotations), ("splits", splits))
            if len(values) > 1
        ]
        shown = ", ".join(
            f"label {f.label!r} split {f.split or '(none)'!r}" + (f" at {f.origin}" if f.origin else "") for f in rows
        )
        return None, [
            DeadLetter(
                f.uri,
                Stage.LIST,
                Reason.CONFLICTING_LABELS,
                f"{filename!r} is listed {len(rows)} times with different {' and '.join(differ)}: "
                f"{shown}" + (f" (this row: {f.origin})" if f.origin else ""),
            )
            for f in rows
        ]
    first = next((f for f in rows if f.split), rows[0])
    where = f" (kept {first.origin})" if first.origin else ""
    return first, [
        DeadLetter(
            f.uri,
            Stage.LIST,
            Reason.DUPLICATE_INPUT,
            f"{filename!r} is listed more than once" + (f"; this row: {f.origin}" if f.origin else "") + where,
        )
        for f in rows
        if f is not first
    ]


def resolve_same_content(sha256: str, group: Iterable[InputFile]) -> tuple[list[InputFile], list[DeadLetter]]:
    """Inputs with identical bytes are one input: the first filename in sorted order is kept. If
    their labels disagree, none is kept, since the label is ambiguous."""
    group = sorted(group, key=input_order)
    if len(group) < 2:
        return group, []
    labels = sorted({f.label or "" for f in group})
    names = ", ".join(repr(f.filename) for f in group)
    if len(labels) > 1:
        return [], [
            DeadLetter(
                f.uri,
                Stage.LIST,
                Reason.CONFLICTING_LABELS,
                f"the same bytes (sha256 {sha256[:16]}...) are labelled {labels!r}: {names}",
            )
            for f in group
        ]
    return group[:1], [
        DeadLetter(f.uri, Stage.LIST, Reason.DUPLICATE_CONTENT, f"same bytes as {group[0].filename!r} (kept)")
        for f in group[1:]
    ]


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
        unhashed: list[InputFile] = []
        for f in kept:
            (by_content[f.content_sha256] if f.content_sha256 is not None else unhashed).append(f)
        kept = list(unhashed)
        for sha256 in sorted(by_content):
            survivors, dropped = resolve_same_content(sha256, by_content[sha256])
            kept += survivors
            dead += dropped
    return kept, dead


def place_in_shard(rank: int, num_shards: int) -> tuple[int, int]:
    """(shard index, position in the shard) of the input at ``rank`` in its split's hash order:
    round-robin dealing, so shard sizes differ by at most one and each shard is a hash-mixed sample."""
    if num_shards < 1 or rank < 0:
        raise ValueError(f"need rank >= 0 and num_shards >= 1 (got {rank!r}, {num_shards!r})")
    return rank % num_shards, rank // num_shards


def split_shard_count(num_examples: int, *, num_shards: int | None, example_bytes: int, target_shard_bytes: int) -> int:
    """Shards of one split: --num_shards, or derived from the size, and never more than inputs."""
    count = num_shards or plan_num_shards(
        num_examples, example_bytes=example_bytes, target_shard_bytes=target_shard_bytes
    )
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
    split_rule: str = DEFAULT_SPLIT_RULE,
    merged_folders: Mapping[str, Sequence[str]] | None = None,
    known_labels: Sequence[str] = (),
) -> DatasetPlan:
    """Plans every shard of every split.

    Label ids follow ``known_labels``, the lineage of the output folder (ordered_label_names):
    none for a first version, whose ids are the sorted names.

    Inputs without a split get one by ``split_rule`` (see assign_splits; given splits win), and
    the plan's warnings say what a user should know before the run (see plan_warnings). Within a
    split, inputs are sorted by a hash of their filename and dealt round-robin to the
    shards, so shard sizes differ by at most one example, every shard is a random-looking mix of
    classes, and the order inside a shard is by hash too. Everything depends on the filenames
    alone, never on listing order, runner or parallelism.
    """
    files, duplicates = _drop_duplicates(list(files), dedup)
    num_unsplit = sum(1 for f in files if f.split is None)
    files = assign_splits(files, split_fractions or {DEFAULT_SPLIT: 1.0}, rule=split_rule)
    label_names = ordered_label_names((name for f in files for name in class_names(f)), lineage=known_labels)
    class_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for f in files:
        assert f.split is not None  # assign_splits gave each input a split
        for name in class_names(f):
            class_counts[f.split][name] += 1
    label_ids = {name: index for index, name in enumerate(label_names)}
    by_split: dict[str, list[InputFile]] = defaultdict(list)
    for f in files:
        split = f.split
        assert split is not None
        if f.annotations is not None:
            f = replace(f, annotations=f.annotations.with_ids(label_ids))
        by_split[split].append(replace(f, label_id=label_ids[f.label] if f.label is not None else -1))
    shards = []
    for split in sorted(by_split):
        members = sorted(by_split[split], key=lambda f: shard_digest(f.filename))
        count = split_shard_count(
            len(members), num_shards=num_shards, example_bytes=example_bytes, target_shard_bytes=target_shard_bytes
        )
        for index in range(count):
            shards.append(ShardPlan(split, index, count, tuple(members[index::count])))
    return DatasetPlan(
        label_names=label_names,
        shards=tuple(shards),
        num_inputs=len(files) + len(duplicates) + len(dead_letters),
        dead_letters=tuple(sorted([*dead_letters, *duplicates])),
        warnings=tuple(
            plan_warnings(
                class_counts,
                label_names,
                requested=split_fractions,
                num_unsplit=num_unsplit,
                merged_folders=merged_folders,
            )
        ),
    )

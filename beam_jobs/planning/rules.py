"""Pure, deterministic planning: labels, splits, and which input goes to which shard in what order."""

from __future__ import annotations

import hashlib
import heapq
import math
import re
import unicodedata
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from beam_jobs.errors import BadInputError, Reason, Stage
from beam_jobs.listing.names import clean_label, clean_split_name, is_valid_split_name  # noqa: F401 (discover imports it from here)
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


def _digest(purpose: str, filename: str) -> bytes:
    # Each purpose gets its own salt, so that split and shard assignments are independent.
    return hashlib.sha256(f"{purpose}\0{filename}".encode()).digest()


def stable_fraction(filename: str, purpose: str = "split") -> float:
    """A number in [0, 1) fixed by the filename alone: the same on every run, machine and runner."""
    return int.from_bytes(_digest(purpose, filename)[:8], "big") / 2**64


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


SPLIT_RULES = ("stratified", "hash")
DEFAULT_SPLIT_RULE = "stratified"


def split_digest(filename: str) -> bytes:
    """The hash that orders a class's inputs for the stratified rule: the order of
    ``stable_fraction(filename, "split")``, which the hash rule thresholds."""
    return _digest("split", filename)


def split_order(f: InputFile) -> tuple[bytes, str]:
    return split_digest(f.filename), f.filename


def split_bucket_key(f: InputFile) -> tuple[str, int]:
    """(label, bucket of the split hash): the unit in which a class's hash order is counted."""
    return f.label or "", bucket_of(split_digest(f.filename))


def _exact_shares(fractions: Mapping[str, float]) -> dict[str, Fraction]:
    # The decimals as typed (0.9 is 9/10, not the nearest binary float), made to sum to exactly 1,
    # so that quotas never depend on float rounding.
    exact = {name: Fraction(str(value)) for name, value in fractions.items()}
    total = sum(exact.values())
    if not exact or total <= 0 or any(value < 0 for value in exact.values()):
        raise ValueError(f"split fractions must be >= 0 with a positive sum (got {dict(fractions)!r})")
    return {name: value / total for name, value in exact.items()}


def split_quotas(total: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """How many of ``total`` inputs each split gets: the largest-remainder rounding of
    ``fraction * total``, so they sum to ``total`` exactly (150 at train=0.9,validation=0.1 is
    135/15, as Keras's validation_split gives). Ties go to the split named first."""
    shares = _exact_shares(fractions)
    ideal = {name: total * share for name, share in shares.items()}
    counts = {name: math.floor(value) for name, value in ideal.items()}
    order = {name: index for index, name in enumerate(shares)}
    left = total - sum(counts.values())
    for name in sorted(ideal, key=lambda n: (counts[n] - ideal[n], order[n]))[:left]:
        counts[name] += 1
    return counts


def _cell_tie(label: str, split: str) -> bytes:
    # Equal remainders are common (classes of equal size); a hash of the cell breaks the tie, so
    # that the extra units do not all go to the first split or the first class.
    return _digest("split-tie", f"{label}\0{split}")


def stratified_counts(class_sizes: Mapping[str, int], fractions: Mapping[str, float]) -> dict[str, dict[str, int]]:
    """{label: {split: inputs}}: each split gets exactly its quota (split_quotas over all the
    classes' inputs), each class exactly its inputs, and each cell is as near as rounding allows
    to the class's share of the split.

    Like scikit-learn's StratifiedShuffleSplit, with both totals held: the ideal cell is
    ``n_class * quota / total``; cells start at its floor, and at 1 in every split for a class
    with at least as many inputs as there are splits (as many such classes as a split's quota
    allows, the largest first), rows and columns over their totals give back the units furthest
    above their ideal, then the units left go by largest remainder to cells whose row and column
    still have room. Integer arithmetic and hash tie-breaks make it the same on every machine.
    """
    splits = list(fractions)
    labels = sorted(class_sizes)
    total = sum(class_sizes.values())
    quotas = split_quotas(total, fractions)
    if total == 0:
        return {label: {split: 0 for split in splits} for label in labels}
    # ideal[cell] is total times the ideal share, an integer: exact arithmetic, and fast (no Fraction).
    ideal = {(c, s): class_sizes[c] * quotas[s] for c in labels for s in splits}
    cells = {cell: value // total for cell, value in ideal.items()}
    floor = dict.fromkeys(ideal, 0)  # the lower bound of each cell
    tie = {cell: _cell_tie(*cell) for cell in ideal}
    eligible = [c for c in labels if class_sizes[c] >= len(splits)]
    for s in splits:
        for c in sorted(eligible, key=lambda c: (-ideal[c, s], tie[c, s]))[: quotas[s]]:
            floor[c, s] = 1
            cells[c, s] = max(cells[c, s], 1)

    def above_ideal(cell: tuple[str, str]) -> int:
        return cells[cell] * total - ideal[cell]

    def give_back(members: list[tuple[str, str]], target: int) -> None:
        # The cell furthest above its ideal first: the min-heap's key is ideal - cell.
        heap = [(-above_ideal(cell), tie[cell], cell) for cell in members]
        heapq.heapify(heap)
        excess = sum(cells[cell] for cell in members) - target
        while excess > 0:  # Always possible: the lower bounds of a row or column fit its total.
            _, _, cell = heapq.heappop(heap)
            if cells[cell] > floor[cell]:
                cells[cell] -= 1
                excess -= 1
                heapq.heappush(heap, (-above_ideal(cell), tie[cell], cell))

    for c in labels:
        give_back([(c, s) for s in splits], class_sizes[c])
    for s in splits:
        give_back([(c, s) for c in labels], quotas[s])
    row_room = {c: class_sizes[c] - sum(cells[c, s] for s in splits) for c in labels}
    col_room = {s: quotas[s] - sum(cells[c, s] for c in labels) for s in splits}
    # The largest remainder first: the min-heap's key is cell - ideal.
    heap = [(above_ideal(cell), tie[cell], cell) for cell in ideal]
    heapq.heapify(heap)
    while heap:
        _, _, (c, s) = heapq.heappop(heap)
        if row_room[c] > 0 and col_room[s] > 0:
            cells[c, s] += 1
            row_room[c] -= 1
            col_room[s] -= 1
            heapq.heappush(heap, (above_ideal((c, s)), tie[c, s], (c, s)))
    if any(row_room.values()) or any(col_room.values()):  # Impossible: every unit fits some cell.
        raise RuntimeError(f"stratified split counts do not add up: {row_room!r}, {col_room!r}")
    return {c: {s: cells[c, s] for s in splits} for c in labels}


def split_at_rank(rank: int, counts: Mapping[str, int]) -> str:
    """The split of the input at ``rank`` in its class's hash order: the splits take contiguous
    ranges of that order, in the order --splits names them."""
    end = 0
    for split, count in counts.items():
        end += count
        if rank < end:
            return split
    raise ValueError(f"rank {rank!r} is beyond the class's {end} inputs")


def assign_splits_stratified(files: Iterable[InputFile], fractions: Mapping[str, float]) -> list[InputFile]:
    """Gives each input without a split one, exactly by the fractions and per class.

    The counts are stratified_counts'; within a class, inputs in hash order fill them in turn,
    so which input goes where depends on the filenames alone. Adding m inputs to a class of the
    listing moves at most about m + 2 of its existing inputs across each boundary between two
    splits (its ranks shift by at most m, its counts by a share of m plus rounding), and a class
    that gained nothing keeps its inputs but for a rounding unit or two near a boundary.
    """
    files = list(files)
    unsplit: dict[str, list[InputFile]] = defaultdict(list)
    for f in files:
        if f.split is None:
            unsplit[f.label or ""].append(f)
    counts = stratified_counts({label: len(members) for label, members in unsplit.items()}, fractions)
    chosen: dict[int, str] = {}
    for label, members in unsplit.items():
        for rank, f in enumerate(sorted(members, key=split_order)):
            chosen[id(f)] = split_at_rank(rank, counts[label])
    return [replace(f, split=chosen[id(f)]) if f.split is None else f for f in files]


def assign_splits_by_hash(files: Iterable[InputFile], fractions: Mapping[str, float]) -> list[InputFile]:
    """--split_rule hash: each input without a split falls where its own stable hash falls among
    the fractions. An input's split never depends on the others (adding inputs moves none), but
    the counts are only near the fractions, and a small class can miss a split."""
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
            split = next((n for n, bound in zip(names, bounds, strict=True) if position < bound), names[-1])
            f = replace(f, split=split)
        result.append(f)
    return result


def assign_splits(
    files: Iterable[InputFile], fractions: Mapping[str, float], *, rule: str = DEFAULT_SPLIT_RULE
) -> list[InputFile]:
    """Gives each input without a split one by ``rule`` (see SPLIT_RULES); given splits are kept."""
    if rule not in SPLIT_RULES:
        raise ValueError(f"split rule must be one of {SPLIT_RULES} (got {rule!r})")
    return (assign_splits_stratified if rule == "stratified" else assign_splits_by_hash)(files, fractions)


def _shown(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


_DECIMAL = re.compile(r"[0-9]+")


def _first_label_out_of_numeric_order(label_names: Sequence[str]) -> str | None:
    """The first label whose id (its place in ``label_names``) is not its place in numeric order,
    when every label is a decimal integer ('0', '1', '10', '2': '10'); else None.

    A first version's ids are the positions of the sorted names, as Keras gives them, so a tree
    and a list agree; later versions keep each label's id (ordered_label_names). Nothing is
    renumbered behind the user's back; only the surprise is said."""
    if not label_names or not all(_DECIMAL.fullmatch(label) for label in label_names):
        return None
    numeric = sorted(label_names, key=lambda label: (int(label), label))
    return next((text for text, number in zip(label_names, numeric, strict=True) if text != number), None)


def plan_warnings(
    class_counts: Mapping[str, Mapping[str, int]],
    label_names: Sequence[str],
    *,
    requested: Mapping[str, float] | None,
    num_unsplit: int,
    merged_folders: Mapping[str, Sequence[str]] | None = None,
    retired: Collection[str] | None = None,
) -> list[str]:
    """What a user should know before a long run, from the plan's small facts: split folders
    merged into one split, classes whose names differ only by case, labels that look like numbers
    but whose ids are not in numeric order, --splits that no input took,
    a requested split that received nothing, and classes missing from a split. ``class_counts``
    is {split: {label: count}}.

    A ``retired`` label (one the lineage keeps for its id, but no input has: see with_label_map)
    is missing from every split on purpose, and not reported as missing from each; None: the
    labels no split counts, which at plan time are exactly those."""
    if retired is None:
        retired = {label for label in label_names if not any(counts.get(label) for counts in class_counts.values())}
    warnings = [
        f"the split folders {_shown(list(folders))} are one split {split!r} (split names are lower case)"
        for split, folders in sorted((merged_folders or {}).items())
    ]
    by_folded: dict[str, list[str]] = defaultdict(list)
    for label in label_names:
        by_folded[label.casefold()].append(label)
    # Labels are compared as written (a dataset may mean "US" and "us"), but case twins are
    # more often one class typed twice: said, never merged behind the user's back.
    warnings += [
        f"the classes {_shown(sorted(twins))} differ only by case; they are separate classes"
        for _, twins in sorted(by_folded.items())
        if len(twins) > 1
    ]
    out_of_order = _first_label_out_of_numeric_order(label_names)
    if out_of_order is not None and list(label_names) == sorted(label_names):
        warnings.append(
            f"labels look like numbers but ids follow sorted text order ({out_of_order!r} has id "
            f"{list(label_names).index(out_of_order)}); dataset_info.json's label_names maps ids to "
            "names (Keras does the same); name them 00, 01, ... to keep numeric order"
        )
    elif out_of_order is not None:
        warnings.append(
            f"labels look like numbers but their ids are not in numeric order ({out_of_order!r} has id "
            f"{list(label_names).index(out_of_order)}): each label keeps the id an earlier version gave it "
            "and new labels take the next ones; dataset_info.json's label_names maps ids to names "
            "(--relabel sorted renumbers them in sorted text order)"
        )
    if requested and num_unsplit == 0:
        warnings.append(
            f"--splits {','.join(requested)} was ignored: every input already has a split "
            "(from the tree's split folders or the input list's split column)"
        )
    elif requested:
        warnings += [
            f"--splits asks for {split!r}, but none of the {num_unsplit} inputs without a split went to it "
            "(too few inputs for its fraction)"
            for split in requested
            if split not in class_counts
        ]
    for split in sorted(class_counts):
        missing = [label for label in label_names if label not in retired and not class_counts[split].get(label)]
        if missing:
            warnings.append(
                f"split {split!r} has no example of {len(missing)} class{'es' if len(missing) != 1 else ''}: "
                f"{_shown(missing)}"
            )
    return warnings


# --relabel: keep = every later version of an output folder keeps its labels' ids (the default);
# sorted = this version numbers its labels as a first version would, by their sorted names.
RELABEL_CHOICES = ("keep", "sorted")


def ordered_label_names(present: Iterable[str], *, lineage: Sequence[str] = ()) -> tuple[str, ...]:
    """The label names in id order: the ``lineage``'s first, each at its id (those no input has any
    more included, so that a removed label's id is never given to another), then the new ones,
    sorted. A first version has no lineage: its ids are the sorted names, as Keras numbers a
    tree's folders."""
    known = tuple(lineage)
    return known + tuple(sorted(set(present) - set(known)))


def label_lineage(chain: Sequence[Mapping]) -> tuple[str, ...]:
    """The label names, in id order, whose ids the next version of an output folder keeps, from its
    manifests newest first (the current one first): the current version's label_names, then the
    names an earlier version gave later ids that a rollback left out, so that those ids are never
    given to other labels.

    A version numbered otherwise (one before a --relabel sorted, or a rollback across one) ends
    the walk: its ids belong to another numbering. Pure."""
    if not chain:
        return ()
    lineage = list(chain[0].get("label_names") or [])
    for manifest in chain[1:]:
        names = list(manifest.get("label_names") or [])
        shared = min(len(names), len(lineage))
        if names[:shared] != lineage[:shared]:
            break
        lineage += names[len(lineage) :]
    return tuple(lineage)


def label_id_changes(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """What the map ``after`` does to the labels of ``before``, in name order: "'aaa' 2 -> 0" for
    a label given another id, "'aaa' (id 2) is dropped" for one ``after`` does not hold. Pure."""
    old = {name: index for index, name in enumerate(before)}
    new = {name: index for index, name in enumerate(after)}
    return [
        f"{name!r} (id {old[name]}) is dropped" if name not in new else f"{name!r} {old[name]} -> {new[name]}"
        for name in sorted(old)
        if new.get(name) != old[name]
    ]


def _labels_with_ids(names: Sequence[str], ids: Mapping[str, int], *, limit: int = 10) -> str:
    shown = ", ".join(f"{name!r} (id {ids[name]})" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _label_map_line(
    before: Sequence[str],
    after: Sequence[str],
    *,
    retired_before: Collection[str],
    retired: Sequence[str],
    relabel: str,
) -> str | None:
    """One line saying what a version's label map changes against the current version's, or None."""
    ids = {name: index for index, name in enumerate(after)}
    new = [name for name in after if name not in before and name not in retired]
    newly_retired = [name for name in retired if name not in retired_before]
    back = [name for name in after if name in retired_before and name not in retired]
    parts = []
    if len(new) == 1:
        parts.append(f"{new[0]!r} is new with id {ids[new[0]]}")
    elif new:
        parts.append(f"{_labels_with_ids(new, ids)} are new")
    if len(newly_retired) == 1:
        parts.append(
            f"{_labels_with_ids(newly_retired, ids)} is retired: no input has it, and no other label will take its id"
        )
    elif newly_retired:
        parts.append(
            f"{_labels_with_ids(newly_retired, ids)} are retired: no input has them, and no other label will "
            "take their ids"
        )
    if back:
        parts.append(f"{_labels_with_ids(back, ids)} {'is' if len(back) == 1 else 'are'} back")
    if relabel == "sorted":
        renumbered = label_id_changes(before, after)
        if renumbered:
            return "; ".join([f"label ids renumbered by --relabel sorted: {', '.join(renumbered)}", *parts])
        parts.insert(0, "--relabel sorted renumbered none (they follow the sorted names already)")
    return "label ids: " + "; ".join(parts) if parts else None


def with_label_map(
    summary: Mapping, *, before: Sequence[str], retired_before: Collection[str], relabel: str, appending: bool
) -> dict:
    """The plan's summary, with what its label map means against the current version's (``before``,
    in id order, of which ``retired_before`` are retired; () when there is none). Pure.

    A removed label stays in label_names, at its id, with zero counts: every id a reader of any
    version sees is still an index of label_names, and no other label takes it. Adds
    ``retired_labels``, those names (absent when none), and ``label_ids_changed``, one line that
    says what changed (absent when nothing did, and for a first version). An append's inputs need
    not show every class the version holds: only those retired already stay retired."""
    after = list(summary["label_names"])
    present = {
        name
        for facts in summary.get("splits", {}).values()
        for name, count in facts.get("class_counts", {}).items()
        if count
    }
    retired = [
        name
        for name in after
        if name not in present and (not appending or name in retired_before or name not in before)
    ]
    mapped = {key: value for key, value in summary.items() if key not in ("retired_labels", "label_ids_changed")}
    if retired:
        mapped["retired_labels"] = retired
    line = (
        _label_map_line(before, after, retired_before=set(retired_before), retired=retired, relabel=relabel)
        if before
        else None
    )
    if line is not None:
        mapped["label_ids_changed"] = line
    return mapped


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

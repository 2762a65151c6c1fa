"""Split rules, pure: which split each input without one goes to (stratified exactly, or by hash)."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction

from beam_jobs.planning.group_rules import one_split_per_group, split_key
from beam_jobs.planning.hashing import (
    _digest,
    bucket_of,
    stable_fraction,
)
from beam_jobs.records import InputFile

SPLIT_RULES = ("stratified", "hash")
DEFAULT_SPLIT_RULE = "stratified"


def split_digest(filename: str) -> bytes:
    """The hash that orders a class's inputs for the stratified rule: the order of
    ``stable_fraction(filename, "split")``, which the hash rule thresholds."""
    return _digest("split", filename)


def split_order(f: InputFile) -> tuple[bytes, str]:
    """An input's place in its class's split-hash order (the filename breaks a digest tie). The
    hash is of its split group's id (group_rules.split_key), so a group's members are adjacent."""
    return split_digest(split_key(f)), f.filename


def split_bucket_key(f: InputFile) -> tuple[str, int]:
    """(label, bucket of the split hash): the unit in which a class's hash order is counted."""
    return f.label or "", bucket_of(split_digest(split_key(f)))


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
            position = stable_fraction(split_key(f), "split") * total
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
    files = list(files)
    given = {id(f) for f in files if f.split is not None}
    assigned = (assign_splits_stratified if rule == "stratified" else assign_splits_by_hash)(files, fractions)
    groups: dict[str, list[tuple[InputFile, bool]]] = defaultdict(list)
    for before, after in zip(files, assigned, strict=True):
        if after.split_group is not None:
            groups[after.split_group].append((after, id(before) in given))
    settled = {f.filename: f for members in groups.values() for f in one_split_per_group(members)}
    return [settled.get(f.filename, f) if f.split_group is not None else f for f in assigned]

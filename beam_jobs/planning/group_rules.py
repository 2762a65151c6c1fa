"""Split groups, pure: which inputs must share a split (near-copies, and the user's own groups).

An input's signature (imaging/perceptual_hash.py) is a 64-bit grey hash, 8 bytes of chromaticity
and 2 of tone; two inputs are near-copies when their grey hashes are at most ``t`` bits apart, no
chromaticity byte differs by more than MAX_CHROMA_STEP and neither tone byte by more than its
MAX_TONE_STEPS (a dataset made with the method before the tone, LEGACY_PERCEPTUAL_HASH, compares
without it). They are found without comparing all
pairs, and without missing one: two hashes at most ``t`` bits apart agree exactly on at least one
of ``t + 1`` disjoint bands of their bits (pigeonhole), so each input is keyed by each of its
bands, and only inputs sharing a band value are compared. A pair is reported by the first band
on which it agrees, so each pair once. Groups are then the connected components of the pairs:
every pair of near-copies ends in one group, so no such pair can span two splits (single
linkage: a chain of near-copies is one group).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import numpy as np

from beam_jobs.records import InputFile

__all__ = [
    "ASSIGNED",
    "DEFAULT_NEAR_COPY_BITS",
    "GIVEN",
    "HELD",
    "LEGACY_PERCEPTUAL_HASH",
    "MAX_TONE_STEPS",
    "PERCEPTUAL_HASH",
    "SPLIT_GROUPS",
    "band_keys",
    "connected_groups",
    "copy_memberships",
    "group_edges",
    "hamming",
    "held_splits_apart",
    "one_split_per_group",
    "pairs_in_band",
    "split_key",
]

SPLIT_GROUPS = ("none", "near_copies")
# The largest distance at which two hashes are near-copies: measured by benchmarks/near_copies.py
# (docs/leakage.md has the table of recall and false pairs per threshold).
DEFAULT_NEAR_COPY_BITS = 14
# The largest difference of one quadrant's chromaticity byte (of 255) between near-copies: 0.05,
# above the 99th percentile of the held-out copies' (0.023), below what tells smooth images apart.
MAX_CHROMA_STEP = 13
HASH_BITS = 64  # of the grey hash
# Beyond this, the bands are too narrow to narrow anything (and unrelated photos are ~32 bits apart).
MAX_NEAR_COPY_BITS = 24
# Rows of a band compared at once: a block's distances are _BLOCK x members bytes.
_BLOCK = 256
# imaging/perceptual_hash.py's signatures, as manifests name them: new datasets use the first; one
# made with the second keeps it for --resume and --append (preflight.with_dataset_defaults).
PERCEPTUAL_HASH = "dct64+chroma4+tone2"
LEGACY_PERCEPTUAL_HASH = "dct64+chroma4"
PERCEPTUAL_HASHES = (PERCEPTUAL_HASH, LEGACY_PERCEPTUAL_HASH)
# The largest differences of the tone bytes between near-copies: 30 levels of the mean (brightness
# changed by 10% or by 25 levels, a gamma of 0.8-1.25) and 16 steps (0.4) of the log standard
# deviation (the held-out copies' 99th percentile: 0.28). Measured by benchmarks/near_copies.py:
# they take the false pairs among 2,902 small tiles from 95 to 29, and leave recall as it was.
MAX_TONE_STEPS = (30, 16)
_LOW_64_BITS = 2**64 - 1


def hamming(a: int, b: int) -> int:
    """How many bits the grey hashes of two signatures differ in."""
    return (((a ^ b) >> 64) & _LOW_64_BITS).bit_count()


def _chroma(signature: int) -> np.ndarray:
    return np.frombuffer((signature & _LOW_64_BITS).to_bytes(8, "big"), dtype=np.uint8)


def _tone(signature: int) -> np.ndarray:
    """The tone bytes (mean, log standard deviation); zeros in a signature made without them."""
    return np.frombuffer(((signature >> 128) & 0xFFFF).to_bytes(2, "big"), dtype=np.uint8)


def near_copies(
    a: int,
    b: int,
    threshold: int,
    chroma_step: int | None = MAX_CHROMA_STEP,
    tone_steps: tuple[int, int] | None = MAX_TONE_STEPS,
) -> bool:
    """Whether two signatures are near-copies (the module's docstring); ``chroma_step`` None: by
    the grey hash alone (a dataset stored in grey, where colour tells nothing apart);
    ``tone_steps`` None: without the tone (a dataset made with LEGACY_PERCEPTUAL_HASH)."""
    close_colours = chroma_step is None or int(np.abs(_chroma(a).astype(np.int16) - _chroma(b)).max()) <= chroma_step
    close_tones = tone_steps is None or bool(
        (np.abs(_tone(a).astype(np.int16) - _tone(b)) <= np.array(tone_steps)).all()
    )
    return hamming(a, b) <= threshold and close_colours and close_tones


def _bands(threshold: int) -> list[tuple[int, int]]:
    """(shift, width) of the threshold + 1 disjoint bands that cover the hash's bits."""
    count = threshold + 1
    widths = [HASH_BITS // count + (1 if index < HASH_BITS % count else 0) for index in range(count)]
    bands, shift = [], 0
    for width in widths:
        bands.append((shift, width))
        shift += width
    return bands


def band_keys(signature: int, threshold: int) -> list[tuple[int, int]]:
    """(band index, the grey hash's bits in that band) for each band: the keys under which an
    input meets every input whose grey hash is within ``threshold`` bits of its own."""
    grey = (signature >> 64) & _LOW_64_BITS
    return [(index, (grey >> shift) & ((1 << width) - 1)) for index, (shift, width) in enumerate(_bands(threshold))]


def pairs_in_band(
    band: int,
    members: Iterable[tuple[str, int]],
    threshold: int,
    chroma_step: int | None = MAX_CHROMA_STEP,
    tone_steps: tuple[int, int] | None = MAX_TONE_STEPS,
) -> Iterator[tuple[str, str, int]]:
    """(name, name, grey distance) for each pair of ``members`` ((name, signature) sharing one band
    value) that are near-copies and whose first equal band is ``band``, names in order.

    A band of a large dataset holds thousands of members (real photos' hashes are far from
    uniform), so all of it is numpy: the distances of a block of rows to every later member, the
    colours of the pairs within the threshold, and their earlier bands, compared at once."""
    ordered = sorted(members)
    if len(ordered) < 2:
        return
    names = [name for name, _ in ordered]
    grey = np.array([(signature >> 64) & _LOW_64_BITS for _, signature in ordered], dtype=np.uint64)
    chroma = np.stack([_chroma(signature) for _, signature in ordered]).astype(np.int16)
    tone = np.stack([_tone(signature) for _, signature in ordered]).astype(np.int16)
    earlier = np.stack(
        [(grey >> np.uint64(shift)) & np.uint64((1 << width) - 1) for shift, width in _bands(threshold)[:band]]
        or [np.zeros(len(ordered), np.uint64)],
        axis=1,
    )
    for start in range(0, len(ordered) - 1, _BLOCK):
        rows = np.arange(start, min(start + _BLOCK, len(ordered) - 1))
        distances = np.bitwise_count(grey[rows, None] ^ grey[None, :])
        candidates = (distances <= threshold) & (rows[:, None] < np.arange(len(ordered))[None, :])
        i, j = np.nonzero(candidates)
        i = rows[i]
        near = np.ones(len(i), dtype=bool)
        if chroma_step is not None:
            near &= np.abs(chroma[i] - chroma[j]).max(axis=1) <= chroma_step
        if tone_steps is not None:
            near &= (np.abs(tone[i] - tone[j]) <= np.array(tone_steps)).all(axis=1)
        if band:  # a pair equal on an earlier band is that band's to report
            near &= ~(earlier[i] == earlier[j]).any(axis=1)
        for a, b in zip(i[near], j[near], strict=True):
            yield names[a], names[b], int(distances[a - start, b])


def group_edges(members: Iterable[str]) -> Iterator[tuple[str, str]]:
    """The members of one user group (a ``group`` column's value, a name's captured group) as a
    chain of pairs: enough to join them all in one component, with one pair per member."""
    ordered = sorted(set(members))
    yield from zip(ordered, ordered[1:], strict=False)  # each member with the next


def copy_memberships(kept: InputFile | None, rows: Iterable[InputFile]) -> list[tuple[str, str]]:
    """(user group, kept input's name) for each row dropped as a copy of ``kept`` (same path listed
    twice, or same bytes under --dedup content) whose user group is another: the one kept is then
    a member of that group too. A dropped copy is not in the dataset, but its group is: patient
    B's photo that is byte for byte patient A's keeps A and B in one split, as it would if both
    were kept. None kept (the copies conflict): nothing stays to be a member."""
    if kept is None:
        return []
    groups = {f.user_group for f in rows if f is not kept and f.user_group and f.user_group != kept.user_group}
    return [(group, kept.filename) for group in sorted(groups)]


def connected_groups(edges: Iterable[tuple[str, str]]) -> dict[str, str]:
    """{name: its group's id} for every name in a pair: the connected components of the pairs,
    each named by its smallest name, so that the same pairs give the same groups on any runner."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]  # path halving
            name = parent[name]
        return name

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the smaller name is the root: components named by their minimum
    return {name: root(name) for name in parent}


def split_key(f: InputFile) -> str:
    """What an input's split is decided by: its group's id when it has one, else its own name;
    so every member of a group has the same split hash, and lies in one run of the hash order."""
    return f.split_group or f.filename


# How firmly a member's split is fixed when its group is settled (one_split_per_group): held by
# the version an append adds to (it never moves), given by the user (split folders, a split
# column), or assigned by the split rule. True and False, as callers pass them, are GIVEN and ASSIGNED.
ASSIGNED, GIVEN, HELD = 0, 1, 2


def _anchor_split(members: list[tuple[InputFile, int]]) -> str | None:
    """The split a group takes: the split of its most firmly fixed member (held, then given),
    the first by name among equals; else the split its own id (its smallest name) was assigned."""
    fixed = sorted((-int(rank), f.filename, f.split) for f, rank in members if rank and f.split is not None)
    if fixed:
        return fixed[0][2]
    return min((f for f, _ in members), key=lambda f: f.filename).split


def held_splits_apart(members: Iterable[tuple[InputFile, int]]) -> dict[str, str]:
    """{split: its first held member by name} when a group's held members (an append's version's
    examples) are in two or more splits, else {}: joined only now, through a new input near both
    sides (held examples never move), so any split for that input is a leak."""
    first: dict[str, str] = {}
    for f, rank in sorted(members, key=lambda member: member[0].filename):
        if rank == HELD and f.split is not None:
            first.setdefault(f.split, f.filename)
    return first if len(first) > 1 else {}


def one_split_per_group(members: Iterable[tuple[InputFile, int]]) -> list[InputFile]:
    """The members of one group ((input, how firmly its split is fixed: ASSIGNED, GIVEN, HELD)),
    all in the group's split (the anchor's; see _anchor_split).

    The split rules give a group one split already when its members share a class and fall in
    one split's range of its hash order; this settles the rest: a group across classes, across
    a boundary between two splits, joined to an input whose split was given, or to an example the
    version appended to holds. A member whose split was given or held keeps it (it is the user's,
    or already written), so a group given two splits stays split: the leakage report counts such
    pairs."""
    members = list(members)
    split = _anchor_split(members)
    return [f if rank else replace(f, split=split) for f, rank in members]

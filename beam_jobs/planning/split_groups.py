"""--split_groups in Beam: which inputs must share a split, found before splits are assigned.

    FindSplitGroups: InputFile -> InputFile with split_group (None: a group of its own)
      WithHeld        -> and, for an append, the examples the version holds (their signatures
                         and user groups read back from its sidecars, never decoded again)
      KeyByBand       -> ((band, bits), (name, hash)) for each of the threshold + 1 bands
      GroupByBand     -> the inputs that agree on one band: the only ones ever compared
      PairsInBand     -> (name, name, distance) within the threshold, each pair once
      UserGroups      -> a chain of pairs per user group (a group column, --group_pattern)
      JoinPairs       -> one element: {name: group id} for every name in a pair (the connected
                         components), the near pairs, and how many inputs have a user group

Only pairs travel to the one element that joins them into groups: their number grows with the
near-copies a collection holds, not with its size.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

import apache_beam as beam

from beam_jobs.planning.group_rules import band_keys, connected_groups, group_edges, pairs_in_band
from beam_jobs.records import InputFile

__all__ = ["FindSplitGroups", "group_warnings", "split_group_report"]

# How many of the largest groups the manifest names, and how many members of each (by name): what
# inspect-tfrecords draws of them.
LARGEST_GROUPS = 10
LARGEST_GROUP_MEMBERS = 24


def _band_items(f: InputFile, *, threshold: int) -> Iterator[tuple[tuple[int, int], tuple[str, int]]]:
    if f.phash is not None and f.phash >= 0:  # not NO_SIGNATURE
        for key in band_keys(f.phash, threshold):
            yield key, (f.filename, f.phash)


def _pairs(
    group: tuple[tuple[int, int], Iterable[tuple[str, int]]],
    *,
    threshold: int,
    chroma_step: int | None,
    tone_steps: tuple[int, int] | None,
) -> Iterator[tuple[str, str]]:
    (band, _), members = group
    for a, b, _ in pairs_in_band(band, members, threshold, chroma_step, tone_steps):
        yield a, b


def _user_group_edges(group: tuple[str, Iterable[str]]) -> Iterator[tuple[str, str]]:
    return group_edges(group[1])


def _with_group(f: InputFile, groups: Mapping[str, str]) -> InputFile:
    group = groups.get(f.filename)
    return f if group is None else replace(f, split_group=group)


def split_group_report(
    near_pairs: list[tuple[str, str]],
    groups: Mapping[str, str],
    splits: Mapping[str, str],
    *,
    method: str | None,
    threshold: int | None,
) -> dict:
    """What dataset_info.json records of the groups: how they were found, how many there are, the
    largest, and the near-copy pairs whose two inputs ended in different splits (only possible
    where the user gave both splits, or an append found held examples of two splits near one new
    input: the planner puts a group in one split)."""
    # Members per group id, among the inputs the plan gave a split: an input it dead-lettered (one
    # joining held examples of two splits) is in no split, so it is no member the report counts.
    groups = {name: group for name, group in groups.items() if name in splits}
    sizes = collections.Counter(groups.values())
    largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:LARGEST_GROUPS]
    shown: dict[str, list[str]] = {group: [] for group, _ in largest}
    for name in sorted(groups):
        members = shown.get(groups[name])
        if members is not None and len(members) < LARGEST_GROUP_MEMBERS:
            members.append(name)
    # Inputs without a split (dead letters of the plan) are in no split, so in no pair across.
    across = sorted((a, b) for a, b in near_pairs if a in splits and b in splits and splits[a] != splits[b])
    split_sets: dict[str, set] = {}
    for name, group in groups.items():
        if name in splits:
            split_sets.setdefault(group, set()).add(splits[name])
    spanning = sorted(group for group, names in split_sets.items() if len(names) > 1)
    return {
        "method": method,
        "near_copy_bits": threshold,
        "near_copy_pairs": len(near_pairs),
        "groups": len(sizes),
        "grouped_inputs": len(groups),
        "largest_groups": [{"id": group, "inputs": size, "members": shown[group]} for group, size in largest],
        "pairs_across_splits": len(across),
        "pairs_across_splits_examples": [list(pair) for pair in across[:LARGEST_GROUPS]],
        # Groups whose members were given two splits (split folders, a split column), or written in
        # two by earlier versions (an append joined them): given and held splits are kept, so such
        # a group spans them.
        "groups_across_splits": len(spanning),
        "groups_across_splits_examples": spanning[:LARGEST_GROUPS],
    }


def group_warnings(report: dict, *, user_inputs: int) -> list[str]:
    """The plan's warnings about groups: a --group_pattern that formed no group (a typo in it would
    otherwise split every patient per image, silently), and groups given two splits."""
    warnings = []
    pattern = report.get("group_pattern")
    if pattern is not None and not user_inputs:
        warnings.append(
            f"--group_pattern {pattern!r} matched no input's relative path: no user group was formed, "
            "and inputs are split one by one (check its case and slashes)"
        )
    if report["groups_across_splits"]:
        examples = ", ".join(map(repr, report["groups_across_splits_examples"][:3]))
        warnings.append(
            f"{report['groups_across_splits']} group(s) hold inputs whose splits were given (split folders, a "
            f"split column) or written by an earlier version, and differ, so each spans two splits: {examples}"
        )
    return warnings


class _JoinedPairs(beam.CombineFn):
    """All pairs, and how many inputs have a user group, in one element: {"groups": {name: group
    id} (connected_groups of every pair), "pairs": [the near-copy pairs], "user_inputs": count}.

    One combine in place of two lists and a count, each a stage with its empty default's: a tree's
    run with --split_groups near_copies has 35 stages where it had 41 (the time saved is within the
    noise of 8,000 photos). Elements: (name, name, near) for a pair, 1 for an input with a user
    group; a bundle's count is summed before the combine, so only pairs travel."""

    def create_accumulator(self) -> tuple[list, int]:
        return [], 0

    def add_input(self, accumulator: tuple[list, int], element: tuple[str, str, bool] | int) -> tuple[list, int]:
        pairs, members = accumulator
        if isinstance(element, int):
            return pairs, members + element
        pairs.append(element)
        return pairs, members

    def merge_accumulators(self, accumulators: Iterable[tuple[list, int]]) -> tuple[list, int]:
        pairs: list = []
        members = 0
        for more, count in accumulators:
            pairs.extend(more)
            members += count
        return pairs, members

    def extract_output(self, accumulator: tuple[list, int]) -> dict:
        pairs, members = accumulator
        return {
            "groups": connected_groups((a, b) for a, b, _ in pairs),
            "pairs": [(a, b) for a, b, near in pairs if near],
            "user_inputs": members,
        }


def _near_edge(pair: tuple[str, str]) -> tuple[str, str, bool]:
    return pair[0], pair[1], True


def _user_edge(pair: tuple[str, str]) -> tuple[str, str, bool]:
    return pair[0], pair[1], False


class FindSplitGroups(beam.PTransform):
    """InputFile -> InputFile with its split group; tagged output ``found``: one element {"groups":
    {name: group id} of the grouped inputs, "pairs": the near-copy pairs, "user_inputs": how many
    inputs have a user group}.

    For an append, ``held`` are the examples the version holds, as InputFiles with their split
    (append_joins.held_member): they are grouped with the new inputs, so that a new near-copy of
    a held example, or a new member of a held user group, joins that example's group; output
    ``held`` (only then): those of them in a group, whose splits the group then takes (AssignSplits).
    ``user_groups`` False: no input can have a user group (a tree without --group_pattern, not
    appended to), so the user groups' stages are left out."""

    def __init__(
        self,
        *,
        near_copy_bits: int | None,
        max_chroma_step: int | None = None,
        max_tone_steps: tuple[int, int] | None = None,
        held: beam.PCollection | None = None,
        user_groups: bool = True,
    ) -> None:
        super().__init__()
        self._threshold = near_copy_bits
        self._chroma_step = max_chroma_step
        self._tone_steps = None if max_tone_steps is None else tuple(max_tone_steps)
        self._held = held
        self._user_groups = user_groups

    def expand(self, new: beam.PCollection) -> dict[str, beam.PCollection]:
        """Near pairs by band, user groups as chains, then one union of all pairs into groups."""
        inputs = new if self._held is None else (new, self._held) | "WithHeld" >> beam.Flatten()
        parts = []
        if self._threshold is not None:
            parts.append(
                inputs
                | "KeyByBand" >> beam.FlatMap(_band_items, threshold=self._threshold)
                | "GroupByBand" >> beam.GroupByKey()
                # ((band, bits), [(name, hash), ...]): the inputs that agree on one band
                | "PairsInBand"
                >> beam.FlatMap(
                    _pairs, threshold=self._threshold, chroma_step=self._chroma_step, tone_steps=self._tone_steps
                )
                | "NearEdges" >> beam.Map(_near_edge)
            )
        if self._user_groups:
            members = inputs | "UserGroupMembers" >> beam.FlatMap(
                lambda f: [(f.user_group, f.filename)] if f.user_group else []
            )
            parts.append(
                members
                | "UserGroups" >> beam.GroupByKey()
                | "UserGroupChains" >> beam.FlatMap(_user_group_edges)
                | "UserEdges" >> beam.Map(_user_edge)
            )
            parts.append(members | "CountUserMember" >> beam.Map(lambda _: 1))
        if not parts:
            parts.append(inputs.pipeline | "NoPairs" >> beam.Create([]))
        found = tuple(parts) | "AllPairs" >> beam.Flatten() | "JoinPairs" >> beam.CombineGlobally(_JoinedPairs())
        groups = found | "Groups" >> beam.Map(lambda joined: joined["groups"])
        # {name: group id}: only the inputs in a pair
        grouped = new | "WithGroup" >> beam.Map(_with_group, beam.pvalue.AsSingleton(groups))
        outputs = {"inputs": grouped, "found": found}
        if self._held is not None:  # no empty stage for a run that holds nothing
            outputs["held"] = (
                self._held
                | "HeldWithGroup" >> beam.Map(_with_group, beam.pvalue.AsSingleton(groups))
                | "GroupedHeld" >> beam.Filter(lambda f: f.split_group is not None)
            )
        return outputs

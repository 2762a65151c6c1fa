"""--split_groups in Beam: which inputs must share a split, found before splits are assigned.

    FindSplitGroups: InputFile -> InputFile with split_group (None: a group of its own)
      WithHeld        -> and, for an append, the examples the version holds (their signatures
                         and user groups read back from its sidecars, never decoded again)
      KeyByBand       -> ((band, bits), (name, hash)) for each of the threshold + 1 bands
      GroupByBand     -> the inputs that agree on one band: the only ones ever compared
      PairsInBand     -> (name, name, distance) within the threshold, each pair once
      UserGroups      -> the members of each user group of two or more (a group column,
                         --group_pattern, a dropped copy's group)
      JoinPairs       -> one element: {name: group id} for every name in a pair or a user group
                         (the connected components), the near pairs, the user groups, and how
                         many inputs have a user group

Only pairs and the members of user groups travel to the one element that joins them into groups:
their number grows with the near-copies and the grouped inputs a collection holds, not with its
size.
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


def _with_group(f: InputFile, groups: Mapping[str, str]) -> InputFile:
    group = groups.get(f.filename)
    return f if group is None else replace(f, split_group=group)


def split_group_report(
    near_pairs: list[tuple[str, str]],
    user_groups: list[tuple[str, tuple[str, ...]]],
    splits: Mapping[str, str],
    *,
    method: str | None,
    threshold: int | None,
) -> dict:
    """What dataset_info.json records of the groups: how they were found, how many there are, the
    largest, and the near-copy pairs whose two inputs ended in different splits (only possible
    where the user gave both splits, or an append found held examples of two splits near one new
    input: the planner puts a group in one split).

    The groups are those of the inputs the plan gave a split (``splits``), joined again without
    the ones it dead-lettered: a new input near held examples of two splits is dropped, and the
    held examples, which it alone joined, are no group across splits (they are not near-copies of
    each other). Members of one user group stay one group whichever of them were dropped."""
    kept_pairs = [(a, b) for a, b in near_pairs if a in splits and b in splits]
    user_edges = [
        edge for _, members in user_groups for edge in group_edges(name for name in members if name in splits)
    ]
    groups = connected_groups([*kept_pairs, *user_edges])
    sizes = collections.Counter(groups.values())
    largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:LARGEST_GROUPS]
    shown: dict[str, list[str]] = {group: [] for group, _ in largest}
    for name in sorted(groups):
        members = shown.get(groups[name])
        if members is not None and len(members) < LARGEST_GROUP_MEMBERS:
            members.append(name)
    across = sorted((a, b) for a, b in kept_pairs if splits[a] != splits[b])
    split_sets: dict[str, set] = {}
    for name, group in groups.items():
        split_sets.setdefault(group, set()).add(splits[name])
    spanning = sorted(group for group, names in split_sets.items() if len(names) > 1)
    return {
        "method": method,
        "near_copy_bits": threshold,
        "near_copy_pairs": len(kept_pairs),
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


def group_warnings(report: dict, *, user_inputs: int, user_groups: int) -> list[str]:
    """The plan's warnings about groups: a --group_pattern that formed no group, because it matched
    nothing or captured a value of its own for every input (a typo in it, or a capture that takes
    in the file's own number, would otherwise split every patient per image, silently), and groups
    given two splits. ``user_groups``: the user groups of two or more inputs."""
    warnings = []
    pattern = report.get("group_pattern")
    if pattern is not None and not user_inputs:
        warnings.append(
            f"--group_pattern {pattern!r} matched no input's relative path: no user group was formed, "
            "and inputs are split one by one (check its case and slashes)"
        )
    elif pattern is not None and not user_groups:
        warnings.append(
            f"--group_pattern {pattern!r} captured a different value in each of the {user_inputs} paths it "
            "matched: no user group was formed, and inputs are split one by one (it should capture the part "
            "that members share, such as the patient, not the file's own name or number)"
        )
    if report["groups_across_splits"]:
        examples = ", ".join(map(repr, report["groups_across_splits_examples"][:3]))
        warnings.append(
            f"{report['groups_across_splits']} group(s) hold inputs whose splits were given (split folders, a "
            f"split column) or written by an earlier version, and differ, so each spans two splits: {examples}"
        )
    return warnings


class _JoinedPairs(beam.CombineFn):
    """All pairs and user groups, and how many inputs have a user group, in one element: {"groups":
    {name: group id} (connected_groups of the near pairs and of each user group's members as a
    chain), "pairs": [the near-copy pairs], "user_groups": [(group, members)], "user_inputs": n}.

    One combine in place of two lists and a count, each a stage with its empty default's: a tree's
    run with --split_groups near_copies has 35 stages where it had 41 (the time saved is within the
    noise of 8,000 photos). Elements: (name, name) for a near pair, (group, (members...)) for a
    user group of two or more, 1 for an input with a user group; a bundle's count is summed before
    the combine, so only pairs and groups travel. The report joins them again without the inputs
    the plan dead-letters (split_group_report), so it keeps the members, not only the chains."""

    def create_accumulator(self) -> tuple[list, list, int]:
        return [], [], 0

    def add_input(self, accumulator: tuple[list, list, int], element: tuple | int) -> tuple[list, list, int]:
        pairs, user_groups, members = accumulator
        if isinstance(element, int):
            return pairs, user_groups, members + element
        (user_groups if isinstance(element[1], tuple) else pairs).append(element)
        return pairs, user_groups, members

    def merge_accumulators(self, accumulators: Iterable[tuple[list, list, int]]) -> tuple[list, list, int]:
        pairs: list = []
        user_groups: list = []
        members = 0
        for more_pairs, more_groups, count in accumulators:
            pairs.extend(more_pairs)
            user_groups.extend(more_groups)
            members += count
        return pairs, user_groups, members

    def extract_output(self, accumulator: tuple[list, list, int]) -> dict:
        pairs, user_groups, members = accumulator
        chains = [edge for _, names in user_groups for edge in group_edges(names)]
        return {
            "groups": connected_groups([*pairs, *chains]),
            "pairs": pairs,
            "user_groups": sorted(user_groups),
            "user_inputs": members,
        }


def _user_group(group: tuple[str, Iterable[str]]) -> list[tuple[str, tuple[str, ...]]]:
    """A user group of two or more members (a single member joins nothing)."""
    members = tuple(sorted(set(group[1])))
    return [(group[0], members)] if len(members) > 1 else []


class FindSplitGroups(beam.PTransform):
    """InputFile -> InputFile with its split group; tagged output ``found``: one element {"groups":
    {name: group id} of the grouped inputs, "pairs": the near-copy pairs, "user_groups": [(group,
    members)] of two or more, "user_inputs": how many inputs have a user group} (_JoinedPairs).

    For an append, ``held`` are the examples the version holds, as InputFiles with their split
    (append_joins.held_member): they are grouped with the new inputs, so that a new near-copy of
    a held example, or a new member of a held user group, joins that example's group; output
    ``held`` (only then): those of them in a group, whose splits the group then takes (AssignSplits).
    ``user_groups`` False: no input can have a user group (a tree without --group_pattern, not
    appended to), so the user groups' stages are left out. ``memberships``: (user group, name) of
    the inputs kept, or held, in place of a dropped copy with that group (copy_memberships)."""

    def __init__(
        self,
        *,
        near_copy_bits: int | None,
        max_chroma_step: int | None = None,
        max_tone_steps: tuple[int, int] | None = None,
        held: beam.PCollection | None = None,
        user_groups: bool = True,
        memberships: beam.PCollection | None = None,
    ) -> None:
        super().__init__()
        self._threshold = near_copy_bits
        self._chroma_step = max_chroma_step
        self._tone_steps = None if max_tone_steps is None else tuple(max_tone_steps)
        self._held = held
        self._user_groups = user_groups
        self._memberships = memberships

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
            )
        if self._user_groups:
            members = inputs | "UserGroupMembers" >> beam.FlatMap(
                lambda f: [(f.user_group, f.filename)] if f.user_group else []
            )
            listed = members
            if self._memberships is not None:
                listed = (members, self._memberships) | "WithCopyMemberships" >> beam.Flatten()
            parts.append(listed | "UserGroups" >> beam.GroupByKey() | "UserGroupLists" >> beam.FlatMap(_user_group))
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

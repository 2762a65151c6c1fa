"""Splits for the inputs that have none: by hash, or stratified exactly per class.

The stratified rule needs each input's rank in its class's split-hash order. It is found by
buckets, as shard places are (planning/hashing.py::bucket_offsets), but the per-(class, bucket) offsets (up to
labels x 4096 of them) are never a side input: they are computed per class (at most 4096 counts
each) and joined to the inputs of their bucket with CoGroupByKey.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

import apache_beam as beam

from beam_jobs.errors import Reason, Stage
from beam_jobs.planning.append_joins import PLAN_DEAD_LETTERS
from beam_jobs.planning.group_rules import ASSIGNED, GIVEN, HELD, held_splits_apart, one_split_per_group
from beam_jobs.planning.rules import (
    SPLIT_RULES,
    assign_splits_by_hash,
    bucket_offsets,
    split_at_rank,
    split_bucket_key,
    split_order,
    stratified_counts,
)
from beam_jobs.records import DeadLetter, InputFile

__all__ = ["SPLIT_INPUTS", "AssignSplits"]

SPLIT_INPUTS = "inputs"


def _with_hash_split(f: InputFile, *, fractions: Mapping[str, float]) -> InputFile:
    return assign_splits_by_hash([f], fractions)[0]


def _in_split(f: InputFile, *, split: str) -> InputFile:
    return f if f.split is not None else replace(f, split=split)


def _split_counts(class_sizes: list[tuple[str, int]], *, fractions: Mapping[str, float]) -> dict:
    """{label: {split: count}} for the inputs without a split: labels x splits, small."""
    return stratified_counts(dict(class_sizes), fractions)


def _class_bucket_offsets(group: tuple[str, Iterable[tuple[int, int]]]) -> Iterator[tuple[tuple[str, int], int]]:
    """((label, bucket), offset) for each bucket of one class: at most NUM_BUCKETS counts."""
    label, counts = group
    for bucket, offset in bucket_offsets(dict(counts)).items():
        yield (label, bucket), offset


def _split_bucket(group: tuple[tuple[str, int], Mapping[str, Iterable]], split_counts: dict) -> Iterator[InputFile]:
    """Gives the inputs of one (class, bucket) their splits: rank in the class's hash order =
    bucket offset + rank inside the bucket, and the ranks fill the class's split counts in turn."""
    (label, _), joined = group
    offset = next(iter(joined["offset"]))
    for index, f in enumerate(sorted(joined["inputs"], key=split_order)):
        yield replace(f, split=split_at_rank(offset + index, split_counts[label]))


class AssignSplits(beam.PTransform):
    """InputFile -> InputFile with a split: given splits are kept, the others follow ``rule``.

    ``grouped``: the inputs carry split groups, and each group ends in one split; ``held`` (an
    append's grouped examples, FindSplitGroups' output) then fix the split of the groups they are
    in, and are not output (they are written already)."""

    def __init__(
        self,
        fractions: Mapping[str, float],
        rule: str,
        *,
        grouped: bool = False,
        held: beam.PCollection | None = None,
    ) -> None:
        super().__init__()
        if rule not in SPLIT_RULES:
            raise ValueError(f"split rule must be one of {SPLIT_RULES} (got {rule!r})")
        self._fractions = dict(fractions)
        self._rule = rule
        self._grouped = grouped
        self._held = held

    def expand(self, inputs: beam.PCollection) -> dict[str, beam.PCollection]:
        """The rule's splits; with split groups, then one split per group (see _OneSplitPerGroup).
        Output SPLIT_INPUTS, and with groups PLAN_DEAD_LETTERS: an append's new inputs that no
        split can take (without groups there are none, and no stage to say so)."""
        if not self._grouped:
            return {SPLIT_INPUTS: self._by_rule(inputs)}
        given, unsplit = inputs | "SplitGiven" >> beam.Partition(
            lambda f, _: 0 if f.split is not None else 1,  # type: ignore[arg-type]  # as in _by_rule
            2,
        )
        tagged = [
            given | "TagGiven" >> beam.Map(lambda f: (f, GIVEN)),
            self._by_rule(unsplit) | "TagAssigned" >> beam.Map(lambda f: (f, ASSIGNED)),
        ]
        if self._held is not None:
            tagged.append(self._held | "TagHeld" >> beam.Map(lambda f: (f, HELD)))
        return tuple(tagged) | "TaggedSplits" >> beam.Flatten() | "OneSplitPerGroup" >> _OneSplitPerGroup()

    def _by_rule(self, inputs: beam.PCollection) -> beam.PCollection:
        """By hash, a Map; stratified, per-(class, bucket) counts give each class's sizes and each
        bucket's offset, and the offsets join their bucket's inputs."""
        if len(self._fractions) == 1:
            # One split takes every input, by either rule: a Map, not the rule's shuffles.
            return inputs | "OneSplit" >> beam.Map(_in_split, split=next(iter(self._fractions)))
        if self._rule == "hash":
            return inputs | "SplitByHash" >> beam.Map(_with_hash_split, fractions=self._fractions)
        # The ignore: Beam's type comment asks Partition for a PartitionFn, though it wraps a plain function itself.
        given, unsplit = inputs | "HasSplit" >> beam.Partition(
            lambda f, _: 0 if f.split is not None else 1,  # type: ignore[arg-type]
            2,
        )
        keyed = unsplit | "KeyByLabelBucket" >> beam.Map(lambda f: (split_bucket_key(f), f))
        per_class = (
            keyed
            | "OneByLabelBucket" >> beam.Map(lambda kv: (kv[0], 1))
            | "CountPerLabelBucket" >> beam.CombinePerKey(sum)
            | "KeyBucketCountsByLabel" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupBucketsByLabel" >> beam.GroupByKey()
            # (label, [(bucket, count), ...]): at most NUM_BUCKETS per class
        )
        split_counts = (
            per_class
            | "LabelSize" >> beam.Map(lambda group: (group[0], sum(count for _, count in group[1])))
            | "LabelSizes" >> beam.combiners.ToList()
            | "SplitCounts" >> beam.Map(_split_counts, fractions=self._fractions)
        )
        # {label: {split: count}}: one small element
        offsets = per_class | "LabelBucketOffsets" >> beam.FlatMap(_class_bucket_offsets)
        # ((label, bucket), offset)
        assigned = (
            {"offset": offsets, "inputs": keyed}
            | "JoinOffsets" >> beam.CoGroupByKey()
            # ((label, bucket), {"offset": [offset], "inputs": [InputFile, ...]})
            | "SplitInBucket" >> beam.FlatMap(_split_bucket, beam.pvalue.AsSingleton(split_counts))
        )
        return (given, assigned) | "WithSplits" >> beam.Flatten()


def _keyed_by_group(tagged: tuple[InputFile, int]) -> tuple[str, tuple[InputFile, int]]:
    return tagged[0].split_group or "", tagged


def _settled(group: tuple[str, Iterable[tuple[InputFile, int]]]) -> Iterator:
    """The members of one group in its split; its held members only anchor it (not output). A
    group whose held members are in two splits (joined only now, by new near-copies of both) has
    no split for its new members without a leak: each is a dead letter naming both sides, unless
    its split was given (the user's, kept and counted as a group across splits)."""
    members = list(group[1])
    apart = held_splits_apart(members)
    if apart:
        sides = ", ".join(f"{split}: {name!r}" for split, name in sorted(apart.items()))
        for f, rank in members:
            if rank == GIVEN:
                yield f
            elif rank == ASSIGNED:
                detail = (
                    f"a near-copy (or group member) of examples the version holds in {len(apart)} splits ({sides}): "
                    "in any split it would leak; rebuild with --overwrite to regroup them"
                )
                yield beam.pvalue.TaggedOutput(
                    PLAN_DEAD_LETTERS, DeadLetter(f.uri, Stage.LIST, Reason.NEAR_COPY_ACROSS_SPLITS, detail)
                )
        return
    settled = one_split_per_group(members)  # in the members' order
    yield from (f for f, (_, rank) in zip(settled, members, strict=True) if rank != HELD)


class _OneSplitPerGroup(beam.PTransform):
    """(InputFile, how fixed its split is) -> InputFile: the members of each split group in one split
    (group_rules.one_split_per_group). Only grouped inputs are shuffled, by their group's id: a
    group is small, and most inputs are in none."""

    def expand(self, tagged: beam.PCollection) -> dict[str, beam.PCollection]:
        grouped, alone = tagged | "InAGroup" >> beam.Partition(
            lambda member, _: 0 if member[0].split_group is not None else 1,  # type: ignore[arg-type]
            2,
        )
        settled = (
            grouped
            | "KeyByGroup" >> beam.Map(_keyed_by_group)
            | "GroupMembers" >> beam.GroupByKey()
            # (group id, [(InputFile, ASSIGNED | GIVEN | HELD), ...])
            | "SplitOfGroup" >> beam.FlatMap(_settled).with_outputs(PLAN_DEAD_LETTERS, main=SPLIT_INPUTS)
        )
        alone = alone | "Ungrouped" >> beam.Map(lambda member: member[0])
        return {
            SPLIT_INPUTS: (settled[SPLIT_INPUTS], alone) | "WithGroupSplits" >> beam.Flatten(),
            PLAN_DEAD_LETTERS: settled[PLAN_DEAD_LETTERS],
        }

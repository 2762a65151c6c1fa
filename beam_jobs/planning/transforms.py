"""Planning at cluster scale: labels, splits and shard places from combiners and per-input hashes.

No step holds the listing in one element or one worker: the only global state is small (the tree
layout's depths and top folders, and the plan's facts: label names, per-(split, class) and
per-(split, bucket) counts, O(labels x splits + splits x buckets)), gathered in one combine
(plan_facts.py). Each input's shard and position follow from its own hash and those counts (see
``planning/hashing.py::bucket_offsets``), which gives exactly the plan of the in-memory ``plan.plan_dataset``: the
same round-robin over the split's global hash order.

    PlanShards: InputFile | DeadLetter
      RouteListing      -> InputFile, and the listing's dead letters
      ReadTreeLayout    -> InputFile with label (and split) from its folders     (a tree only)
      DropRepeats       -> one InputFile per path (per content with --dedup content)
      SkipHeld          -> the inputs the version appended to does not hold      (--append only)
      HashSignatures    -> InputFile with its perceptual signature               (an append's new inputs)
      FindSplitGroups   -> InputFile with its split group (split_groups.py)      (groups asked for, or a list)
      AssignSplits      -> InputFile with its split (split_assignment.py)
      GatherPlanFacts   -> one small element: layout, label names, counts (plan_facts.py)
      PlaceInShards     -> ShardPlan(split, index, num_shards, inputs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import apache_beam as beam
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.planning.append_joins import (
    GROUP_MEMBERSHIPS,
    HELD_REGROUPED,
    PLAN_CHANGES,
    PLAN_DEAD_LETTERS,
    GroupMembershipOutput,
    PlanDeadLetterOutput,
    SourceChangesFn,
    compare_with_held,
    held_copy,
    held_member,
    with_digest,
)
from beam_jobs.planning.group_rules import copy_memberships
from beam_jobs.planning.plan_facts import (
    DEAD,
    IGNORED_ENTRY,
    LISTED,
    PLANNED,
    UNSPLIT,
    PlanFactsFn,
    bucket_key,
    category_id_map,
    dead_letter_reasons,
    ignored_counts,
    plan_of_facts,
    plan_summary,
    tagged,
)
from beam_jobs.planning.plan_warnings import TOO_FEW_FOR_FRACTION
from beam_jobs.planning.rules import (
    DEFAULT_SPLIT,
    DEFAULT_SPLIT_RULE,
    ShardPlan,
    label_from_tree,
    merged_split_folders,
    place_in_shard,
    resolve_same_content,
    resolve_same_path,
    shard_digest,
    tree_facts,
    tree_reads_splits,
)
from beam_jobs.planning.split_assignment import SPLIT_INPUTS, AssignSplits
from beam_jobs.planning.split_groups import FindSplitGroups, group_warnings, split_group_report
from beam_jobs.records import Annotations, DeadLetter, InputFile

__all__ = [
    "IGNORED_COUNTS",
    "PLAN_DEAD_REASONS",
    "PLAN_CHANGES",
    "PLAN_DEAD_LETTERS",
    "PLAN_SUMMARY",
    "PlanShards",
    "SourceChangesFn",
    "compare_with_held",
    "held_copy",
]

PLAN_SUMMARY = "plan_summary"
# (Ignored kind, count) of the entries the listing left out on purpose, when PlanShards is given them.
IGNORED_COUNTS = "ignored_counts"
# (reason, count) of the plan's dead letters: the plan line's counts, from the same one combine.
PLAN_DEAD_REASONS = "plan_dead_reasons"
_INPUTS = "inputs"
_MERGED = "merged_folders"
# Kept under its old name for callers that check COCO category ids directly.
_category_ids = category_id_map


class PlanShards(beam.PTransform):
    """InputFile | DeadLetter -> ShardPlans, with tagged outputs PLAN_DEAD_LETTERS, PLAN_DEAD_REASONS and
    PLAN_SUMMARY (and PLAN_CHANGES for an append, IGNORED_COUNTS when given the listing's ignored entries).

    The summary is one small dict (label names, input count, per-split counts, shard counts and
    class counts, the split rule, whether --splits was ignored, the plan's warnings); nothing
    else is global. Inputs without a split get one by ``split_rule`` (plan.SPLIT_RULES).
    """

    def __init__(
        self,
        *,
        from_tree: bool,
        tree_layout: str,
        paths_unique: bool = False,
        source: str,
        split_fractions: dict | None,
        num_shards: int | None,
        example_bytes: int,
        target_shard_bytes: int,
        dedup: str,
        split_rule: str = DEFAULT_SPLIT_RULE,
        held: beam.PCollection | None = None,
        known_labels: tuple[str, ...] = (),
        known_kinds: tuple[str, ...] = (),
        state_of: Callable[[InputFile], list] | None = None,
        digests_of: Callable[[InputFile], list] | None = None,
        held_content: beam.PCollection | None = None,
        held_version: int | None = None,
        ignored: beam.PCollection | None = None,
        split_groups: dict | None = None,
        hash_signatures: beam.PTransform | None = None,
    ) -> None:
        super().__init__()
        # InputFile -> InputFile with its perceptual signature, for the inputs to group when the
        # listing did not sign them: after SkipHeld, so that an append signs its new inputs only.
        self._hash_signatures = hash_signatures
        # None: no groups; else the groups' settings (near_copy_bits, ...; {} for user groups only).
        self._split_groups = split_groups
        self._from_tree = from_tree
        self._paths_unique = paths_unique
        self._tree_layout = tree_layout
        self._source = source
        self._requested = split_fractions
        self._fractions = split_fractions or {DEFAULT_SPLIT: 1.0}
        self._split_rule = split_rule
        self._dedup = dedup
        self._held = held  # --append: (identity, record) of each input the version holds
        # --append: what the version appended to holds (see _SkipHeld).
        self._skip_held = (
            _SkipHeld(held, held_content, state_of=state_of, digests_of=digests_of, version=held_version, dedup=dedup)
            if held is not None or held_content is not None
            else None
        )
        # ... and its label names, whose ids never change (new labels get the next ids, in sorted
        # order), and what its examples hold ("annotated", "objects", ...): a row with only a label,
        # appended to a detection set, is then an image with no object, as in a run that made it.
        self._plan_settings = {
            "known_labels": tuple(known_labels),
            "known_kinds": tuple(known_kinds),
            "num_shards": num_shards,
            "example_bytes": example_bytes,
            "target_shard_bytes": target_shard_bytes,
        }
        self._ignored = ignored

    @no_annotations
    def expand(self, listing: beam.PCollection) -> dict[str, beam.PCollection]:
        """Plans every listed input into its shard with global state of a few small elements only, and
        gathers the dead letters of every planning step into one output."""
        routed = listing | "RouteListing" >> beam.FlatMap(_route).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
        inputs, dead = routed[_INPUTS], [routed[PLAN_DEAD_LETTERS]]
        if self._from_tree:
            laid_out = inputs | "ReadTreeLayout" >> _ReadTreeLayout(self._tree_layout)
            inputs, merged = laid_out[_INPUTS], laid_out[_MERGED]
            dead.append(laid_out[PLAN_DEAD_LETTERS])
        else:
            merged = listing.pipeline | "NoSplitFolders" >> beam.Create([{}])
        # {split: [top folders]} for splits named by several folders: one small element
        # An append's held inputs never compete with new ones for "first of the same bytes": the
        # held are skipped first, and a new copy of held bytes is then the held one's duplicate.
        appending = self._skip_held is not None
        grouping = self._split_groups is not None
        # (user group, name): a dropped copy's group, of which the input kept (or held) is a member
        memberships = []
        # A local tree's listing names each path once (the filesystem's names are unique, and each
        # folder is listed by one worker): grouping it by path, a shuffle of every input, would
        # find nothing to drop. An input list can name a path twice, and an object store's keys
        # "a//b.jpg" and "a/b.jpg" are one relative path.
        by_path = not self._paths_unique
        if by_path or (self._dedup == "content" and not appending):
            kept = inputs | "DropRepeats" >> _DropRepeats(
                self._dedup, by_path=by_path, by_content=not appending, memberships=grouping
            )
            inputs = kept[_INPUTS]
            dead.append(kept[PLAN_DEAD_LETTERS])
            if GROUP_MEMBERSHIPS in kept:
                memberships.append(kept[GROUP_MEMBERSHIPS])
        changes = regrouped = None
        if self._skip_held is not None:
            new = inputs | "SkipHeld" >> self._skip_held
            inputs, changes, regrouped = new[_INPUTS], new.get(PLAN_CHANGES), new.get(HELD_REGROUPED)
            dead.append(new[PLAN_DEAD_LETTERS])
            if GROUP_MEMBERSHIPS in new:
                memberships.append(new[GROUP_MEMBERSHIPS])
            if self._dedup == "content":
                fresh = inputs | "DropNewRepeats" >> _DropRepeats(self._dedup, by_path=False, memberships=grouping)
                inputs = fresh[_INPUTS]
                dead.append(fresh[PLAN_DEAD_LETTERS])
                if GROUP_MEMBERSHIPS in fresh:
                    memberships.append(fresh[GROUP_MEMBERSHIPS])
        found = None
        if self._split_groups is not None:
            # An append groups its new inputs with the examples held (their signatures and user
            # groups from the sidecars): a new near-copy of one, or a new member of its group,
            # takes its split.
            held = None
            if self._held is not None:
                current = beam.pvalue.AsDict(regrouped) if regrouped is not None else None
                held = self._held | "HeldMembers" >> beam.FlatMap(held_member, regrouped=current)
            if self._hash_signatures is not None:
                inputs = inputs | "HashSignatures" >> self._hash_signatures
            found = inputs | "FindSplitGroups" >> FindSplitGroups(
                near_copy_bits=self._split_groups.get("near_copy_bits"),
                max_chroma_step=self._split_groups.get("max_chroma_step"),
                max_tone_steps=self._split_groups.get("max_tone_steps"),
                held=held,
                # A tree's inputs have a user group only by --group_pattern (and an append's held
                # examples by their sidecars); a list's, by its group column.
                user_groups=not self._from_tree or "group_pattern" in self._split_groups or held is not None,
                memberships=tuple(memberships) | "AllMemberships" >> beam.Flatten() if memberships else None,
            )
            inputs = found["inputs"]
        assigned = inputs | "AssignSplits" >> AssignSplits(
            self._fractions,
            self._split_rule,
            grouped=found is not None,
            held=found.get("held") if found is not None else None,
        )
        split = assigned[SPLIT_INPUTS]
        if PLAN_DEAD_LETTERS in assigned:
            dead.append(assigned[PLAN_DEAD_LETTERS])
        # InputFile(split, label): one per kept input
        dead_letters = tuple(dead) | "PlanDeadLetters" >> beam.Flatten()
        parts = {LISTED: listing, UNSPLIT: inputs, PLANNED: split, DEAD: dead_letters}
        if self._ignored is not None:
            parts[IGNORED_ENTRY] = self._ignored
        plan = parts | "GatherPlanFacts" >> _GatherPlanFacts(self._plan_settings)
        # {"layout", "label_names", "annotated", "facts"}: one small element
        summary = plan | "Summary" >> beam.Map(
            plan_summary,
            beam.pvalue.AsSingleton(merged, default_value={}),
            source=self._source,
            requested=self._requested,
            split_rule=self._split_rule,
        )
        if found is not None:
            # The report covers the version's groups: an append's held members are in them too.
            reported = split if "held" not in found else (split, found["held"]) | "GroupedWithHeld" >> beam.Flatten()
            summary = summary | "WithSplitGroups" >> _WithGroupReport(reported, found, self._split_groups or {})
        shards = split | "PlaceInShards" >> _PlaceInShards(plan)
        # ShardPlan(split, index, num_shards, inputs): paths of one shard, never pixels
        outputs = {
            "shards": shards,
            PLAN_DEAD_LETTERS: dead_letters,
            PLAN_SUMMARY: summary,
            PLAN_DEAD_REASONS: plan | "DeadLetterReasons" >> beam.FlatMap(dead_letter_reasons),
        }
        if changes is not None:
            outputs[PLAN_CHANGES] = changes
        if self._ignored is not None:
            outputs[IGNORED_COUNTS] = plan | "IgnoredCounts" >> beam.FlatMap(ignored_counts)
        return outputs


class _ReadTreeLayout(beam.PTransform):
    """A tree's inputs get their label (and split) from their folders, by the layout the whole tree
    shows (rules.tree_reads_splits): its depths and top folders are one small combined element."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self._layout = layout

    @no_annotations
    def expand(self, inputs: beam.PCollection) -> dict[str, beam.PCollection]:
        facts = (
            inputs
            | "DepthsAndTops" >> beam.Map(_tree_facts)
            | "TreeFacts" >> beam.CombineGlobally(_TreeFactsFn()).without_defaults()
        )
        # (sorted depths, sorted top folders of three-level images): tiny, whatever the tree; no element
        # for an empty tree (without_defaults: no stage to inject one), so the readers give the default.
        laid_out = inputs | "ApplyTreeLayout" >> beam.FlatMap(
            _apply_layout, beam.pvalue.AsSingleton(facts, default_value=(set(), set())), layout=self._layout
        ).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
        merged = facts | "MergedSplitFolders" >> beam.Map(_merged_folders, layout=self._layout)
        return {_INPUTS: laid_out[_INPUTS], PLAN_DEAD_LETTERS: laid_out[PLAN_DEAD_LETTERS], _MERGED: merged}


class _DropRepeats(beam.PTransform):
    """One input per path (rules.resolve_same_path), and with --dedup content one per content
    (rules.resolve_same_content); each one dropped is a dead letter naming the one kept."""

    def __init__(self, dedup: str, *, by_path: bool = True, by_content: bool = True, memberships: bool = False) -> None:
        super().__init__()
        self._dedup = dedup
        self._by_path = by_path
        self._by_content = by_content
        self._memberships = memberships  # output GROUP_MEMBERSHIPS too (split groups are asked for)

    @no_annotations
    def expand(self, inputs: beam.PCollection) -> dict[str, beam.PCollection]:
        kept, dead, memberships = inputs, [], []
        if self._by_path:
            by_path = (
                inputs
                | "KeyByPath" >> beam.Map(lambda f: (f.filename, f))
                | "GroupByPath" >> beam.GroupByKey()
                # (filename, [InputFile, ...]): one group per path, almost always of one
                | "DropSamePath"
                >> beam.FlatMap(_kept_by_path, dedup=self._dedup).with_outputs(
                    PLAN_DEAD_LETTERS, GROUP_MEMBERSHIPS, main=_INPUTS
                )
            )
            kept, dead = by_path[_INPUTS], [by_path[PLAN_DEAD_LETTERS]]
            memberships.append(by_path[GROUP_MEMBERSHIPS])
        if self._dedup == "content" and self._by_content:
            hashed, unhashed = kept | "HashKnown" >> beam.Partition(
                # Beam's type comment asks Partition for a PartitionFn, though it wraps a plain function itself.
                lambda f, _: 0 if f.content_sha256 is not None else 1,  # type: ignore[arg-type]
                2,
            )
            by_content = (
                hashed
                | "KeyByContent" >> beam.Map(lambda f: (f.content_sha256, f))
                | "GroupByContent" >> beam.GroupByKey()
                # (sha256, [InputFile, ...])
                | "DropSameContent"
                >> beam.FlatMap(_kept_by_content).with_outputs(PLAN_DEAD_LETTERS, GROUP_MEMBERSHIPS, main=_INPUTS)
            )
            kept = (by_content[_INPUTS], unhashed) | "KeptInputs" >> beam.Flatten()
            dead.append(by_content[PLAN_DEAD_LETTERS])
            memberships.append(by_content[GROUP_MEMBERSHIPS])
        outputs = {_INPUTS: kept, PLAN_DEAD_LETTERS: tuple(dead) | "RepeatDeadLetters" >> beam.Flatten()}
        if self._memberships and memberships:
            outputs[GROUP_MEMBERSHIPS] = tuple(memberships) | "CopyMemberships" >> beam.Flatten()
        return outputs


class _SkipHeld(beam.PTransform):
    """--append: the inputs the version appended to does not hold yet (append_joins.py).

    Before splits are assigned: an input already held keeps its split (it is not planned again),
    and the new ones get theirs by the same rule as a fresh run. Joined by identity (the path
    relative to the source's root), never by absolute uri; then a new input with bytes the version
    holds under the same label is dropped as the same example twice (held_copy)."""

    def __init__(
        self,
        held: beam.PCollection | None,
        held_content: beam.PCollection | None,
        *,
        state_of: Callable[[InputFile], list] | None,
        digests_of: Callable[[InputFile], list] | None,
        version: int | None,
        dedup: str,
    ) -> None:
        super().__init__()
        # (identity, record) of each input held (append.read_held_inputs), and the content keys of
        # its examples, (sha256, (identity, content label)).
        self._held = held
        self._held_content = held_content
        self._state_of = state_of
        self._digests_of = digests_of
        self._version = version
        self._dedup = dedup

    @no_annotations
    def expand(self, inputs: beam.PCollection) -> dict[str, beam.PCollection]:
        outputs: dict[str, beam.PCollection] = {}
        if self._held is not None:
            assert self._state_of is not None, "a listed input's state is compared with the held one's"
            compared = (
                {"listed": inputs | "KeyByName" >> beam.Map(lambda f: (f.filename, f)), "held": self._held}
                | "JoinHeld" >> beam.CoGroupByKey()
                # (identity, {"listed": [InputFile], "held": [record]})
                | "NotHeldYet"
                >> beam.FlatMap(compare_with_held, state_of=self._state_of, digests_of=self._digests_of).with_outputs(
                    PLAN_CHANGES, HELD_REGROUPED, main=_INPUTS
                )
            )
            inputs, outputs[PLAN_CHANGES] = compared[_INPUTS], compared[PLAN_CHANGES]
            outputs[HELD_REGROUPED] = compared[HELD_REGROUPED]
        if self._held_content is None:
            return {**outputs, _INPUTS: inputs, PLAN_DEAD_LETTERS: inputs.pipeline | "NoHeldCopies" >> beam.Create([])}
        assert self._digests_of is not None, "new inputs are hashed to be compared with the held ones"
        checked = (
            {
                "new": inputs
                | "DigestNew" >> beam.Map(with_digest, digests_of=self._digests_of)
                | "KeyNewByContent" >> beam.Map(lambda f: (f.content_sha256, f)),
                "held": self._held_content,
            }
            | "JoinHeldContent" >> beam.CoGroupByKey()
            # (sha256, {"new": [InputFile], "held": [(identity, content label)]})
            | "NotHeldCopies"
            >> beam.FlatMap(held_copy, version=self._version, dedup=self._dedup).with_outputs(
                PLAN_DEAD_LETTERS, GROUP_MEMBERSHIPS, main=_INPUTS
            )
        )
        return {
            **outputs,
            _INPUTS: checked[_INPUTS],
            PLAN_DEAD_LETTERS: checked[PLAN_DEAD_LETTERS],
            GROUP_MEMBERSHIPS: checked[GROUP_MEMBERSHIPS],
        }


class _GatherPlanFacts(beam.PTransform):
    """{LISTED: the listing, UNSPLIT: the kept inputs, PLANNED: those with their splits, DEAD: the plan's
    dead letters, IGNORED_ENTRY (if given): the listing's ignored entries} -> the plan: every global
    fact in one combine (plan_facts.PlanFactsFn), so one shuffle where each fact once took its own."""

    def __init__(self, settings: dict) -> None:
        super().__init__()
        self._settings = settings

    @no_annotations
    def expand(self, parts: dict[str, beam.PCollection]) -> beam.PCollection:
        streams = [
            parts[LISTED] | "TagListed" >> beam.Map(lambda _: tagged(LISTED)),
            parts[UNSPLIT] | "TagUnsplit" >> beam.FlatMap(lambda f: [tagged(UNSPLIT)] if f.split is None else []),
            parts[PLANNED] | "TagPlanned" >> beam.Map(lambda f: tagged(PLANNED, f)),
            parts[DEAD] | "TagDead" >> beam.Map(lambda d: tagged(DEAD, d.reason)),
        ]
        if IGNORED_ENTRY in parts:
            streams.append(parts[IGNORED_ENTRY] | "TagIgnored" >> beam.Map(lambda kind: tagged(IGNORED_ENTRY, kind)))
        return (
            tuple(streams)
            | "AllFacts" >> beam.Flatten()
            | "PlanFacts" >> beam.CombineGlobally(PlanFactsFn())
            # PlanFacts: counts and small sets
            | "Plan" >> beam.Map(plan_of_facts, **self._settings)
        )


class _PlaceInShards(beam.PTransform):
    """InputFile with its split -> ShardPlans: each input's place from its hash's rank in its
    bucket and the bucket's offset in the plan's layout."""

    def __init__(self, plan: beam.PCollection) -> None:
        super().__init__()
        self._plan = plan

    def expand(self, inputs: beam.PCollection) -> beam.PCollection:
        return (
            inputs
            | "KeyBySplitBucket" >> beam.Map(lambda f: (bucket_key(f), f))
            | "GroupByBucket" >> beam.GroupByKey()
            # ((split, bucket), [InputFile, ...]): about 1/4096 of a split each
            | "RankInBucket" >> beam.FlatMap(_rank_bucket, beam.pvalue.AsSingleton(self._plan))
            # ((split, shard), (position, InputFile with label_id))
            | "GroupByShard" >> beam.GroupByKey()
            | "ShardPlan" >> beam.Map(_to_shard_plan, beam.pvalue.AsSingleton(self._plan))
        )


def _route(item: InputFile | DeadLetter) -> Iterator[InputFile | PlanDeadLetterOutput]:
    """InputFile to the main output, DeadLetter to the dead letters."""
    if isinstance(item, DeadLetter):
        yield beam.pvalue.TaggedOutput(PLAN_DEAD_LETTERS, item)
    else:
        yield item


def _tree_facts(f: InputFile) -> tuple[set[int], set[str]]:
    return tree_facts([f])


class _TreeFactsFn(beam.CombineFn):
    """(depths of the images, top folders of three-level images): what decides a tree's layout,
    small whatever the tree (one entry per depth and per top folder)."""

    def create_accumulator(self) -> tuple[set[int], set[str]]:
        return set(), set()

    def add_input(
        self, accumulator: tuple[set[int], set[str]], element: tuple[set[int], set[str]]
    ) -> tuple[set[int], set[str]]:
        accumulator[0].update(element[0])
        accumulator[1].update(element[1])
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[tuple[set[int], set[str]]]) -> tuple[set[int], set[str]]:
        depths: set[int] = set()
        tops: set[str] = set()
        for d, t in accumulators:
            depths |= d
            tops |= t
        return depths, tops

    def extract_output(self, accumulator: tuple[set[int], set[str]]) -> tuple[set[int], set[str]]:
        return accumulator


def _apply_layout(
    f: InputFile, facts: tuple[set[int], set[str]], *, layout: str
) -> Iterator[InputFile | PlanDeadLetterOutput]:
    depths, tops = facts
    item = label_from_tree(f, with_split=tree_reads_splits(depths, tops, layout), depths=depths, tops=tops)
    yield beam.pvalue.TaggedOutput(PLAN_DEAD_LETTERS, item) if isinstance(item, DeadLetter) else item


def _kept_by_path(
    group: tuple[str, Iterable[InputFile]], *, dedup: str
) -> Iterator[InputFile | PlanDeadLetterOutput | GroupMembershipOutput]:
    filename, rows = group
    rows = list(rows)
    kept, dead = resolve_same_path(filename, rows)
    for letter in dead:
        yield PlanDeadLetterOutput(PLAN_DEAD_LETTERS, letter)
    for membership in copy_memberships(kept, rows):
        yield GroupMembershipOutput(GROUP_MEMBERSHIPS, membership)
    if kept is not None:
        yield kept


def _kept_by_content(
    group: tuple[str, Iterable[InputFile]],
) -> Iterator[InputFile | PlanDeadLetterOutput | GroupMembershipOutput]:
    sha256, rows = group
    rows = list(rows)
    kept, dead = resolve_same_content(sha256, rows)
    for letter in dead:
        yield PlanDeadLetterOutput(PLAN_DEAD_LETTERS, letter)
    for membership in copy_memberships(kept[0] if kept else None, rows):
        yield GroupMembershipOutput(GROUP_MEMBERSHIPS, membership)
    yield from kept


def _merged_folders(facts: tuple[set[int], set[str]], *, layout: str) -> dict[str, list[str]]:
    depths, tops = facts
    return merged_split_folders(tops) if tree_reads_splits(depths, tops, layout) else {}


def _rank_bucket(
    group: tuple[tuple[str, int], Iterable[InputFile]], plan: dict
) -> Iterator[tuple[tuple[str, int], tuple[int, InputFile]]]:
    """Places one bucket's inputs: global rank = bucket offset + rank by digest inside the bucket.

    In an ``annotated`` dataset (any input has labels or objects) every input is annotated, a
    one-label row as an image of that class with no object: one layout for all its examples."""
    (split, bucket), members = group
    split_layout, label_names, annotated = plan["layout"][split], plan["label_names"], plan["annotated"]
    label_ids = {name: index for index, name in enumerate(label_names)}
    ordered = sorted(members, key=lambda f: shard_digest(f.filename))
    for index, f in enumerate(ordered):
        assert f.label is not None or f.annotations is not None, "every planned input has its label or annotations"
        shard, position = place_in_shard(split_layout["offsets"][bucket] + index, split_layout["num_shards"])
        if annotated:
            kinds = tuple(kind for kind in annotated if kind != "annotated")
            f = replace(f, annotations=replace(f.annotations or Annotations(), kinds=kinds).with_ids(label_ids))
        yield (split, shard), (position, replace(f, label_id=label_ids[f.label] if f.label is not None else -1))


def _to_shard_plan(group: tuple[tuple[str, int], Iterable[tuple[int, InputFile]]], plan: dict) -> ShardPlan:
    (split, index), members = group
    ordered = tuple(f for _, f in sorted(members, key=lambda member: member[0]))
    return ShardPlan(split, index, plan["layout"][split]["num_shards"], ordered)


def _grouped_split(f: InputFile) -> list[tuple[str, str]]:
    return [(f.filename, f.split)] if f.split_group is not None and f.split is not None else []


def _with_report(summary: dict, found: dict, splits: dict, *, settings: dict) -> dict:
    report = {
        **settings,
        **split_group_report(
            found["pairs"],
            found["user_groups"],
            splits,
            method=settings.get("method"),
            threshold=settings.get("near_copy_bits"),
        ),
    }
    if not settings and not report["groups"]:
        return summary  # an input list without a group column, and no group asked for: nothing to say
    warnings = [
        *(_with_group_cause(w, report) for w in summary.get("warnings", [])),
        *group_warnings(report, user_inputs=found["user_inputs"], user_groups=len(found["user_groups"])),
    ]
    return {**summary, "split_groups": report, "warnings": warnings}


def _with_group_cause(warning: str, report: dict) -> str:
    """A requested split that no input went to names the groups as a cause, when there are any:
    a group is never cut to fill a fraction, so one large group can take a whole class."""
    said_too_few = warning.startswith("--splits asks for") and warning.endswith(TOO_FEW_FOR_FRACTION)
    if not (said_too_few and report["largest_groups"]):
        return warning
    largest = report["largest_groups"][0]
    return warning.removesuffix(TOO_FEW_FOR_FRACTION) + (
        f"(too few inputs or groups for its fraction: a group is never cut, and the largest, "
        f"{largest['id']!r}, has {largest['inputs']} inputs)"
    )


class _WithGroupReport(beam.PTransform):
    """The plan's summary with its split groups' report (split_groups.split_group_report)."""

    def __init__(self, split: beam.PCollection, found: dict, settings: dict) -> None:
        super().__init__()
        self._split = split
        self._found = found
        self._settings = settings

    @no_annotations
    def expand(self, summary: beam.PCollection) -> beam.PCollection:
        splits = (
            self._split | "GroupedSplits" >> beam.FlatMap(_grouped_split) | "GroupedSplitMap" >> beam.combiners.ToDict()
        )
        # {name: split} of the grouped inputs only
        return summary | "Report" >> beam.Map(
            _with_report,
            beam.pvalue.AsSingleton(self._found["found"]),
            beam.pvalue.AsSingleton(splits),
            settings=self._settings,
        )

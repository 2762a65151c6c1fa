"""Planning at cluster scale: labels, splits and shard places from combiners and per-input hashes.

No step holds the listing in one element or one worker: the only global state is small (the tree
layout's depths and top folders, the label names, per-class and per-(class, split) counts, and
per-(split, bucket) counts, O(labels x splits + splits x buckets)). Each input's shard and
position follow from its own hash and those counts (see ``plan.bucket_offsets``), which gives
exactly the plan of the in-memory ``plan.plan_dataset``: the same round-robin over the split's
global hash order.

The stratified split rule needs each input's rank in its class's split-hash order. It is found
the same way, by buckets, but the per-(class, bucket) offsets (up to labels x 4096 of them) are
never a side input: they are computed per class (at most 4096 counts each) and joined to the
inputs of their bucket with CoGroupByKey.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

import apache_beam as beam

from beam_jobs.errors import JobError, Reason, Stage
from beam_jobs.paths import redact
from beam_jobs.planning.rules import (
    DEFAULT_SPLIT,
    DEFAULT_SPLIT_RULE,
    SPLIT_RULES,
    ShardPlan,
    assign_splits_by_hash,
    bucket_of,
    bucket_offsets,
    label_from_tree,
    merged_split_folders,
    place_in_shard,
    plan_warnings,
    resolve_same_content,
    resolve_same_path,
    shard_digest,
    split_at_rank,
    split_bucket_key,
    split_order,
    split_shard_count,
    stratified_counts,
    tree_facts,
    tree_reads_splits,
)
from beam_jobs.records import Annotations, DeadLetter, InputFile, annotation_digest, class_names, content_label

__all__ = [
    "PLAN_CHANGES",
    "PLAN_DEAD_LETTERS",
    "PLAN_SUMMARY",
    "PlanShards",
    "SourceChangesFn",
    "compare_with_held",
    "held_copy",
]

PLAN_DEAD_LETTERS = "plan_dead_letters"
PLAN_SUMMARY = "plan_summary"
# --append: ("held" | "changed" | "removed", identity) for each input the current version holds:
# as it was converted, or not.
PLAN_CHANGES = "plan_changes"
_INPUTS = "inputs"


def compare_with_held(
    group: tuple[str, Mapping[str, Iterable]],
    *,
    state_of: Callable[[InputFile], list],
    digests_of: Callable[[InputFile], list] | None = None,
) -> Iterable:
    """(identity, {"listed": [InputFile], "held": [record]}) -> the new inputs (main output) and
    the changes (PLAN_CHANGES): --append converts only what the current version does not hold.

    The identity is the input's path relative to its source's root (InputFile.filename), so a
    folder moved, copied or remounted elsewhere is the same inputs. An input held with the label,
    annotations and split its shard's sidecar recorded, and with the same bytes, is skipped; one
    that differs in any is "changed", one held but no longer listed "removed": both are reported
    by identity, never silently kept or dropped (the caller decides). ``state_of`` gives a listed
    input's [size, time] (reading.source_state), a hint: when it is the recorded one the bytes
    are taken as unchanged, else ``digests_of`` (reading.source_digests) hashes the source and
    only other bytes are a change. Pure but for ``state_of`` and ``digests_of``.
    """
    name, sides = group
    listed, held = list(sides["listed"]), list(sides["held"])
    if not held:
        yield from listed
        return
    if not listed:
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("removed", name))
        return
    if any(_differs(f, held[0], state_of, digests_of) for f in listed):
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("changed", name))
    else:
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("held", name))


def _differs(
    listed: InputFile, held: dict, state_of: Callable[[InputFile], list], digests_of: Callable[[InputFile], list] | None
) -> bool:
    """Whether a listed input is not what the version holds of it: other bytes (its mask's
    included), another label, other annotations (boxes, labels, mask path), or another split where
    the listing names one (a split the plan would assign is the one it was assigned: old inputs
    never move). Bytes are read only when the size or time differ from those recorded, and
    compared only where the sidecar recorded them (an earlier release's dead letters did not)."""
    if listed.label != held["label"] or annotation_digest(listed) != held.get("annotations"):
        return True
    if listed.split is not None and listed.split != held["split"]:
        return True
    if list(state_of(listed)) == list(held["state"]):
        return False
    recorded = held.get("digests")
    return recorded is None or digests_of is None or list(digests_of(listed)) != list(recorded)


def held_copy(
    group: tuple[str, Mapping[str, Iterable]], *, version: int, dedup: str
) -> Iterator[InputFile | beam.pvalue.TaggedOutput]:
    """(sha256, {"new": [InputFile], "held": [(identity, content label)]}) -> the new inputs that
    are not bytes the version holds already (main output), and a dead letter for each that is
    (PLAN_DEAD_LETTERS).

    A new input with the bytes and the label of an example the version holds would be the same
    example twice: it is ``duplicate_content``, naming the held one. Under another label it is
    kept, and the run's content duplicates report the two (one image taught two labels, as a
    fresh run reports it), unless ``dedup`` is "content", where such copies are
    ``conflicting_labels`` as in a fresh run (the held example stays: an append never changes it).
    """
    sha256, sides = group
    new, held = list(sides["new"]), sorted(sides["held"])
    if not held:
        yield from new
        return
    for f in new:
        same = [identity for identity, label in held if label == content_label(f)]
        if same:
            detail = f"same bytes as {same[0]!r}, held by version {version} under the same label"
            yield beam.pvalue.TaggedOutput(
                PLAN_DEAD_LETTERS, DeadLetter(f.uri, Stage.LIST, Reason.DUPLICATE_CONTENT, detail)
            )
        elif dedup == "content":
            labels = sorted({label for _, label in held} | {content_label(f)})
            detail = (
                f"the same bytes (sha256 {sha256[:16]}...) are labelled {labels!r}: {f.filename!r} and "
                f"{held[0][0]!r}, held by version {version}"
            )
            yield beam.pvalue.TaggedOutput(
                PLAN_DEAD_LETTERS, DeadLetter(f.uri, Stage.LIST, Reason.CONFLICTING_LABELS, detail)
            )
        else:
            yield f


def _with_digest(f: InputFile, *, digests_of: Callable[[InputFile], list]) -> InputFile:
    """A new input with the sha256 of its source (already known under --dedup content)."""
    if f.content_sha256 is not None:
        return f
    return replace(f, content_sha256=digests_of(f)[0])


class SourceChangesFn(beam.CombineFn):
    """("held" | "changed" | "removed", uri) -> {"held": n, "changed": n, "removed": n, and the
    first few uris of each change, sorted}: what --append reports, in one small element."""

    SHOWN = 10

    def create_accumulator(self) -> dict:
        """No input seen yet: nothing held, no change found."""
        return {"held": 0, "changed": [0, []], "removed": [0, []]}

    def add_input(self, accumulator: dict, element: tuple[str, str]) -> dict:
        """Counts one held input or one change, keeping only the first few changed uris in sorted order."""
        kind, uri = element
        if kind == "held":
            accumulator["held"] += 1
        else:
            count, shown = accumulator[kind]
            accumulator[kind] = [count + 1, sorted([*shown, uri])[: self.SHOWN]]
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[dict]) -> dict:
        """Adds up the counts of several workers, and keeps the first few uris of each change of them all."""
        merged = self.create_accumulator()
        for accumulator in accumulators:
            merged["held"] += accumulator["held"]
            for kind in ("changed", "removed"):
                merged[kind] = [
                    merged[kind][0] + accumulator[kind][0],
                    sorted([*merged[kind][1], *accumulator[kind][1]])[: self.SHOWN],
                ]
        return merged

    def extract_output(self, accumulator: dict) -> dict:
        """The counts and the uris shown as flat keys, the shape check_source_changes and the plan report read."""
        return {
            "held": accumulator["held"],
            "changed": accumulator["changed"][0],
            "changed_examples": accumulator["changed"][1],
            "removed": accumulator["removed"][0],
            "removed_examples": accumulator["removed"][1],
        }


def _route(item: InputFile | DeadLetter) -> Iterator[InputFile | beam.pvalue.TaggedOutput]:
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
) -> Iterator[InputFile | beam.pvalue.TaggedOutput]:
    depths, tops = facts
    item = label_from_tree(f, with_split=tree_reads_splits(depths, tops, layout), depths=depths, tops=tops)
    yield beam.pvalue.TaggedOutput(PLAN_DEAD_LETTERS, item) if isinstance(item, DeadLetter) else item


def _kept_by_path(
    group: tuple[str, Iterable[InputFile]], *, dedup: str
) -> Iterator[InputFile | beam.pvalue.TaggedOutput]:
    filename, rows = group
    kept, dead = resolve_same_path(filename, rows)
    for letter in dead:
        yield beam.pvalue.TaggedOutput(PLAN_DEAD_LETTERS, letter)
    if kept is not None:
        yield kept


def _kept_by_content(group: tuple[str, Iterable[InputFile]]) -> Iterator[InputFile | beam.pvalue.TaggedOutput]:
    sha256, rows = group
    kept, dead = resolve_same_content(sha256, rows)
    for letter in dead:
        yield beam.pvalue.TaggedOutput(PLAN_DEAD_LETTERS, letter)
    yield from kept


def _with_hash_split(f: InputFile, *, fractions: Mapping[str, float]) -> InputFile:
    return assign_splits_by_hash([f], fractions)[0]


def _merged_folders(facts: tuple[set[int], set[str]], *, layout: str) -> dict[str, list[str]]:
    depths, tops = facts
    return merged_split_folders(tops) if tree_reads_splits(depths, tops, layout) else {}


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


class _AssignSplits(beam.PTransform):
    """InputFile -> InputFile with a split: given splits are kept, the others follow ``rule``."""

    def __init__(self, fractions: Mapping[str, float], rule: str) -> None:
        super().__init__()
        if rule not in SPLIT_RULES:
            raise ValueError(f"split rule must be one of {SPLIT_RULES} (got {rule!r})")
        self._fractions = dict(fractions)
        self._rule = rule

    def expand(self, inputs: beam.PCollection) -> beam.PCollection:
        if self._rule == "hash":
            return inputs | "SplitByHash" >> beam.Map(_with_hash_split, fractions=self._fractions)
        # The ignores here and in PlanShards: Beam's type comment asks Partition for a PartitionFn, though it
        # wraps a plain function itself.
        given, unsplit = inputs | "HasSplit" >> beam.Partition(
            lambda f, _: 0 if f.split is not None else 1,  # type: ignore[arg-type]
            2,
        )
        split_counts = (
            unsplit
            | "KeyByLabel" >> beam.Map(lambda f: (f.label or "", 1))
            | "CountPerLabel" >> beam.CombinePerKey(sum)
            | "LabelSizes" >> beam.combiners.ToList()
            | "SplitCounts" >> beam.Map(_split_counts, fractions=self._fractions)
        )
        # {label: {split: count}}: one small element
        keyed = unsplit | "KeyByLabelBucket" >> beam.Map(lambda f: (split_bucket_key(f), f))
        offsets = (
            keyed
            | "OneByLabelBucket" >> beam.Map(lambda kv: (kv[0], 1))
            | "CountPerLabelBucket" >> beam.CombinePerKey(sum)
            | "KeyBucketCountsByLabel" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupBucketsByLabel" >> beam.GroupByKey()
            # (label, [(bucket, count), ...]): at most NUM_BUCKETS per class
            | "LabelBucketOffsets" >> beam.FlatMap(_class_bucket_offsets)
        )
        # ((label, bucket), offset)
        assigned = (
            {"offset": offsets, "inputs": keyed}
            | "JoinOffsets" >> beam.CoGroupByKey()
            # ((label, bucket), {"offset": [offset], "inputs": [InputFile, ...]})
            | "SplitInBucket" >> beam.FlatMap(_split_bucket, beam.pvalue.AsSingleton(split_counts))
        )
        return (given, assigned) | "WithSplits" >> beam.Flatten()


def _bucket_key(f: InputFile) -> tuple[str, int]:
    assert f.split is not None, "keyed after every input has its split"
    return f.split, bucket_of(shard_digest(f.filename))


def _layout(
    counts: Iterable[tuple[tuple[str, int], int]],
    *,
    num_shards: int | None,
    example_bytes: int,
    target_shard_bytes: int,
) -> dict:
    """{split: {"count", "num_shards", "offsets": {bucket: offset}}} from per-(split, bucket) counts."""
    by_split: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for (split, bucket), count in counts:
        by_split[split][bucket] = count
    layout = {}
    for split, buckets in sorted(by_split.items()):
        total = sum(buckets.values())
        layout[split] = {
            "count": total,
            "num_shards": split_shard_count(
                total, num_shards=num_shards, example_bytes=example_bytes, target_shard_bytes=target_shard_bytes
            ),
            "offsets": bucket_offsets(buckets),
        }
    return layout


def _rank_bucket(
    group: tuple[tuple[str, int], Iterable[InputFile]],
    layout: dict,
    label_names: tuple[str, ...],
    annotated: tuple[str, ...] = (),
) -> Iterator[tuple[tuple[str, int], tuple[int, InputFile]]]:
    """Places one bucket's inputs: global rank = bucket offset + rank by digest inside the bucket.

    In an ``annotated`` dataset (any input has labels or objects) every input is annotated, a
    one-label row as an image of that class with no object: one layout for all its examples."""
    (split, bucket), members = group
    split_layout = layout[split]
    label_ids = {name: index for index, name in enumerate(label_names)}
    ordered = sorted(members, key=lambda f: shard_digest(f.filename))
    for index, f in enumerate(ordered):
        assert f.label is not None or f.annotations is not None, "every planned input has its label or annotations"
        shard, position = place_in_shard(split_layout["offsets"][bucket] + index, split_layout["num_shards"])
        if annotated:
            kinds = tuple(kind for kind in annotated if kind != "annotated")
            f = replace(f, annotations=replace(f.annotations or Annotations(), kinds=kinds).with_ids(label_ids))
        yield (split, shard), (position, replace(f, label_id=label_ids[f.label] if f.label is not None else -1))


def _to_shard_plan(group: tuple[tuple[str, int], Iterable[tuple[int, InputFile]]], layout: dict) -> ShardPlan:
    (split, index), members = group
    ordered = tuple(f for _, f in sorted(members, key=lambda member: member[0]))
    return ShardPlan(split, index, layout[split]["num_shards"], ordered)


def _summary(
    layout: dict,
    label_names: tuple[str, ...],
    num_listed: int,
    class_counts: list,
    num_unsplit: int,
    merged_folders: dict,
    annotated: tuple[str, ...] = (),
    category_ids: Iterable[tuple[str, int]] = (),
    *,
    source: str,
    requested: Mapping[str, float] | None,
    split_rule: str,
) -> dict:
    """The plan's small facts: what plan.json records, and what finalize needs.

    ``splits_ignored`` says that --splits was given but no input took it (every input had its
    split already), so that dataset_info.json does not claim fractions that were never applied.
    """
    if num_listed == 0:
        raise JobError(f"no image files found in {redact(source)}")
    per_class: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (split, label), count in sorted(class_counts):
        per_class[split][label] = count
    return {
        "label_names": list(label_names),
        "num_inputs": num_listed,
        "splits": {
            split: {
                "num_examples": facts["count"],
                "num_shards": facts["num_shards"],
                "class_counts": dict(sorted(per_class[split].items())),
            }
            for split, facts in sorted(layout.items())
        },
        "split_rule": split_rule,
        # Only for annotated datasets: a one-label dataset's plan is as every release wrote it.
        **({"annotated": True, "annotation_kinds": [k for k in annotated if k != "annotated"]} if annotated else {}),
        **({"category_ids": _category_ids(category_ids)} if category_ids else {}),
        "splits_ignored": bool(requested) and num_unsplit == 0,
        "warnings": plan_warnings(
            per_class, label_names, requested=requested, num_unsplit=num_unsplit, merged_folders=merged_folders
        ),
    }


class PlanShards(beam.PTransform):
    """InputFile | DeadLetter -> ShardPlans, with tagged outputs PLAN_DEAD_LETTERS and PLAN_SUMMARY.

    The summary is one small dict (label names, input count, per-split counts, shard counts and
    class counts, the split rule, whether --splits was ignored, the plan's warnings); nothing
    else is global. Inputs without a split get one by ``split_rule`` (plan.SPLIT_RULES).
    """

    def __init__(
        self,
        *,
        from_tree: bool,
        tree_layout: str,
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
    ) -> None:
        super().__init__()
        # --append: the inputs the current version (``held_version``) holds, (identity, record)
        # (append.read_held_inputs), and its label names, whose ids never change (new labels get
        # the next ids, in sorted order).
        self._held = held
        self._held_version = held_version
        # ... and its examples' content keys, (sha256, (identity, content label)): a new input
        # with bytes it holds is not stored again under the same label (held_copy).
        self._held_content = held_content
        self._digests_of = digests_of
        self._known_labels = tuple(known_labels)
        # ... and what its examples hold ("annotated", "objects", ...): a row with only a label,
        # appended to a detection set, is then an image with no object, as in a run that made it.
        self._known_kinds = tuple(known_kinds)
        self._state_of = state_of
        self._from_tree = from_tree
        self._tree_layout = tree_layout
        self._source = source
        self._requested = split_fractions
        self._fractions = split_fractions or {DEFAULT_SPLIT: 1.0}
        self._split_rule = split_rule
        self._num_shards = num_shards
        self._example_bytes = example_bytes
        self._target_shard_bytes = target_shard_bytes
        self._dedup = dedup

    def expand(self, listing: beam.PCollection) -> dict[str, beam.PCollection]:
        """Plans every listed input into its shard with global state of a few small elements only, and
        gathers the dead letters of every planning step into one output."""
        num_listed = listing | "CountListed" >> beam.combiners.Count.Globally()
        routed = listing | "RouteListing" >> beam.FlatMap(_route).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
        inputs, dead = routed[_INPUTS], [routed[PLAN_DEAD_LETTERS]]
        if self._from_tree:
            facts = (
                inputs | "DepthsAndTops" >> beam.Map(_tree_facts) | "TreeFacts" >> beam.CombineGlobally(_TreeFactsFn())
            )
            # (sorted depths, sorted top folders of three-level images): tiny, whatever the tree
            laid_out = inputs | "ApplyTreeLayout" >> beam.FlatMap(
                _apply_layout,
                beam.pvalue.AsSingleton(facts),
                layout=self._tree_layout,
            ).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
            inputs = laid_out[_INPUTS]
            dead.append(laid_out[PLAN_DEAD_LETTERS])
            merged = facts | "MergedSplitFolders" >> beam.Map(_merged_folders, layout=self._tree_layout)
        else:
            merged = listing.pipeline | "NoSplitFolders" >> beam.Create([{}])
        # {split: [top folders]} for splits named by several folders: one small element
        by_path = (
            inputs
            | "KeyByPath" >> beam.Map(lambda f: (f.filename, f))
            | "GroupByPath" >> beam.GroupByKey()
            # (filename, [InputFile, ...]): one group per path, almost always of one
            | "DropSamePath"
            >> beam.FlatMap(_kept_by_path, dedup=self._dedup).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
        )
        inputs = by_path[_INPUTS]
        dead.append(by_path[PLAN_DEAD_LETTERS])
        if self._dedup == "content":
            hashed, unhashed = inputs | "HashKnown" >> beam.Partition(
                lambda f, _: 0 if f.content_sha256 is not None else 1,  # type: ignore[arg-type]  # see _AssignSplits
                2,
            )
            by_content = (
                hashed
                | "KeyByContent" >> beam.Map(lambda f: (f.content_sha256, f))
                | "GroupByContent" >> beam.GroupByKey()
                # (sha256, [InputFile, ...])
                | "DropSameContent" >> beam.FlatMap(_kept_by_content).with_outputs(PLAN_DEAD_LETTERS, main=_INPUTS)
            )
            inputs = (by_content[_INPUTS], unhashed) | "KeptInputs" >> beam.Flatten()
            dead.append(by_content[PLAN_DEAD_LETTERS])
        changes = None
        if self._held is not None:
            # Before splits are assigned: an input already held keeps its split (it is not planned
            # again), and the new ones get theirs by the same rule as a fresh run.
            # Joined by identity (the path relative to the source's root), never by absolute uri.
            compared = (
                {"listed": inputs | "KeyByName" >> beam.Map(lambda f: (f.filename, f)), "held": self._held}
                | "JoinHeld" >> beam.CoGroupByKey()
                # (identity, {"listed": [InputFile], "held": [record]})
                | "NotHeldYet"
                >> beam.FlatMap(compare_with_held, state_of=self._state_of, digests_of=self._digests_of).with_outputs(
                    PLAN_CHANGES, main=_INPUTS
                )
            )
            inputs, changes = compared[_INPUTS], compared[PLAN_CHANGES]
        if self._held_content is not None:
            assert self._digests_of is not None, "new inputs are hashed to be compared with the held ones"
            checked = (
                {
                    "new": inputs
                    | "DigestNew" >> beam.Map(_with_digest, digests_of=self._digests_of)
                    | "KeyNewByContent" >> beam.Map(lambda f: (f.content_sha256, f)),
                    "held": self._held_content,
                }
                | "JoinHeldContent" >> beam.CoGroupByKey()
                # (sha256, {"new": [InputFile], "held": [(identity, content label)]})
                | "NotHeldCopies"
                >> beam.FlatMap(held_copy, version=self._held_version, dedup=self._dedup).with_outputs(
                    PLAN_DEAD_LETTERS, main=_INPUTS
                )
            )
            inputs = checked[_INPUTS]
            dead.append(checked[PLAN_DEAD_LETTERS])
        num_unsplit = (
            inputs
            | "Unsplit" >> beam.Filter(lambda f: f.split is None)
            | "CountUnsplit" >> beam.combiners.Count.Globally()
        )
        inputs = inputs | "AssignSplits" >> _AssignSplits(self._fractions, self._split_rule)
        # InputFile(split, label): one per kept input
        label_names = (
            inputs
            | "Labels" >> beam.FlatMap(class_names)
            | "DistinctLabels" >> beam.Distinct()
            | "LabelList" >> beam.combiners.ToList()
            | "SortLabels" >> beam.Map(_label_order, known=self._known_labels)
        )
        # (label, ...): one small element
        annotated = (
            inputs
            | "AnnotationKinds" >> beam.Map(_annotation_kinds)
            | "AllAnnotationKinds" >> beam.CombineGlobally(_union)
            | "WithHeldKinds" >> beam.Map(lambda kinds, known: _union([kinds, known]), known=self._known_kinds)
        )
        # What the annotated inputs hold, ("annotated", "labels", "objects", ...), () if none: one small element
        category_ids = (
            inputs
            | "CocoCategoryIds" >> beam.FlatMap(_coco_category_ids)
            | "DistinctCategoryIds" >> beam.Distinct()
            | "CategoryIdList" >> beam.combiners.ToList()
        )
        # [(class name, its COCO category id)]: at most a few per class
        layout = (
            inputs
            | "KeyByBucket" >> beam.Map(lambda f: (_bucket_key(f), 1))
            | "CountPerBucket" >> beam.CombinePerKey(sum)
            # ((split, bucket), count): at most splits x NUM_BUCKETS
            | "BucketCounts" >> beam.combiners.ToList()
            | "SplitLayout"
            >> beam.Map(
                _layout,
                num_shards=self._num_shards,
                example_bytes=self._example_bytes,
                target_shard_bytes=self._target_shard_bytes,
            )
        )
        # {split: {count, num_shards, offsets}}: one small element
        class_counts = (
            inputs
            | "KeyByClass" >> beam.FlatMap(lambda f: [((f.split, name), 1) for name in class_names(f)])
            | "CountPerClass" >> beam.CombinePerKey(sum)
            | "ClassCounts" >> beam.combiners.ToList()
        )
        summary = layout | "Summary" >> beam.Map(
            _summary,
            beam.pvalue.AsSingleton(label_names),
            beam.pvalue.AsSingleton(num_listed),
            beam.pvalue.AsSingleton(class_counts),
            beam.pvalue.AsSingleton(num_unsplit),
            beam.pvalue.AsSingleton(merged),
            beam.pvalue.AsSingleton(annotated),
            beam.pvalue.AsSingleton(category_ids),
            source=self._source,
            requested=self._requested,
            split_rule=self._split_rule,
        )
        shards = (
            inputs
            | "KeyBySplitBucket" >> beam.Map(lambda f: (_bucket_key(f), f))
            | "GroupByBucket" >> beam.GroupByKey()
            # ((split, bucket), [InputFile, ...]): about 1/4096 of a split each
            | "RankInBucket"
            >> beam.FlatMap(
                _rank_bucket,
                beam.pvalue.AsSingleton(layout),
                beam.pvalue.AsSingleton(label_names),
                beam.pvalue.AsSingleton(annotated),
            )
            # ((split, shard), (position, InputFile with label_id))
            | "GroupByShard" >> beam.GroupByKey()
            | "ShardPlan" >> beam.Map(_to_shard_plan, beam.pvalue.AsSingleton(layout))
        )
        # ShardPlan(split, index, num_shards, inputs): paths of one shard, never pixels
        dead_letters = tuple(dead) | "PlanDeadLetters" >> beam.Flatten()
        outputs = {"shards": shards, PLAN_DEAD_LETTERS: dead_letters, PLAN_SUMMARY: summary}
        if changes is not None:
            outputs[PLAN_CHANGES] = changes
        return outputs


def _annotation_kinds(f: InputFile) -> tuple[str, ...]:
    return ("annotated", *f.annotations.own_kinds()) if f.annotations is not None else ()


def _coco_category_ids(f: InputFile) -> Iterable[tuple[str, int]]:
    objects = f.annotations.objects if f.annotations is not None else ()
    return [(o.label, o.category_id) for o in objects if o.category_id is not None]


def _category_ids(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """{class name: its COCO category id}, for evaluating with COCO's own tools; a name with two
    ids (two COCO files that disagree) is refused, since either mapping would be wrong for one."""
    found: dict[str, set[int]] = collections.defaultdict(set)
    for name, ident in pairs:
        found[name].add(ident)
    clashes = {name: sorted(ids) for name, ids in found.items() if len(ids) > 1}
    if clashes:
        shown = "; ".join(f"{name!r}: ids {ids}" for name, ids in sorted(clashes.items()))[:400]
        raise JobError(f"the COCO files give one category several ids ({shown}); give each name one id")
    return {name: next(iter(ids)) for name, ids in sorted(found.items())}


def _union(kinds: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """The sorted union of kinds (associative: Beam may combine partial unions)."""
    return tuple(sorted({kind for group in kinds for kind in group}))


def _label_order(labels: Iterable[str], *, known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The label names in id order: those of the version appended to first, unchanged, then the
    new ones sorted (a fresh run: all sorted)."""
    return known + tuple(sorted(set(labels) - set(known)))

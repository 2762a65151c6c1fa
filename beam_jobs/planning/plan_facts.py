"""The plan's global facts, gathered in one pass over the planned inputs.

Planning needs a handful of small global facts: how many inputs were listed and how many had no
split, the label names, what the annotations hold, the COCO category ids, the per-(split, bucket)
counts that place each input in its shard, and the per-(split, class) counts. Each was once its own
combine or Distinct, and each of those is a shuffle and a fused stage of its own: a stage is one
more bundle to schedule on every runner, and on Flink one more SDK worker call. ``PlanFactsFn``
gathers them all in one combine over one tagged stream (``tagged_facts``), so that they cost one
shuffle, and ``plan_of_facts`` turns the one accumulator into what the planner reads.

Everything kept is small whatever the dataset's size: O(labels x splits + splits x NUM_BUCKETS).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import apache_beam as beam

from beam_jobs.errors import JobError, Reason
from beam_jobs.paths import redact
from beam_jobs.planning.rules import (
    bucket_of,
    bucket_offsets,
    plan_warnings,
    shard_digest,
    split_shard_count,
)
from beam_jobs.records import InputFile, class_names

__all__ = [
    "DEAD",
    "IGNORED_ENTRY",
    "LISTED",
    "PLANNED",
    "UNSPLIT",
    "PlanFacts",
    "PlanFactsFn",
    "bucket_key",
    "dead_letter_reasons",
    "ignored_counts",
    "plan_of_facts",
    "plan_summary",
    "tagged",
]

# What each element of the facts' stream is: (tag, item).
LISTED = "listed"  # an entry of the listing (an input or its dead letter): item None
UNSPLIT = "unsplit"  # a kept input with no split of its own: item None
PLANNED = "planned"  # a kept input with its split: item the InputFile
IGNORED_ENTRY = "ignored"  # an entry the listing left out on purpose: item its Ignored kind
DEAD = "dead"  # a dead letter of the listing or the plan: item its reason


@dataclass
class PlanFacts:
    """The accumulator: counts and small sets, mergeable in any order (Beam combines partial ones)."""

    listed: int = 0
    unsplit: int = 0
    labels: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)
    category_ids: set[tuple[str, int]] = field(default_factory=set)
    buckets: collections.Counter = field(default_factory=collections.Counter)  # (split, bucket) -> n
    classes: collections.Counter = field(default_factory=collections.Counter)  # (split, class) -> n
    ignored: collections.Counter = field(default_factory=collections.Counter)  # Ignored kind -> n
    dead: collections.Counter = field(default_factory=collections.Counter)  # dead letter reason -> n

    def add(self, tag: str, item: object) -> None:
        """Counts one element of the stream (see the tags above)."""
        if tag == LISTED:
            self.listed += 1
        elif tag == UNSPLIT:
            self.unsplit += 1
        elif tag == IGNORED_ENTRY:
            self.ignored[item] += 1
        elif tag == DEAD:
            self.dead[item] += 1
        else:
            assert isinstance(item, InputFile), "a planned input"
            names = class_names(item)
            self.labels.update(names)
            self.kinds.update(annotation_kinds(item))
            self.category_ids.update(coco_category_ids(item))
            self.buckets[bucket_key(item)] += 1
            self.classes.update((item.split, name) for name in names)

    def merge(self, other: PlanFacts) -> None:
        """Adds another worker's partial facts to these."""
        self.listed += other.listed
        self.unsplit += other.unsplit
        self.labels |= other.labels
        self.kinds |= other.kinds
        self.category_ids |= other.category_ids
        self.buckets.update(other.buckets)
        self.classes.update(other.classes)
        self.ignored.update(other.ignored)
        self.dead.update(other.dead)


class PlanFactsFn(beam.CombineFn):
    """(tag, item) -> PlanFacts: every global fact of the plan in one combine."""

    def create_accumulator(self) -> PlanFacts:
        """Nothing seen yet."""
        return PlanFacts()

    def add_input(self, accumulator: PlanFacts, element: tuple[str, object]) -> PlanFacts:
        """Counts one tagged element."""
        accumulator.add(*element)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[PlanFacts]) -> PlanFacts:
        """The facts of several workers, as one."""
        merged = PlanFacts()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: PlanFacts) -> PlanFacts:
        """The facts as gathered; plan_of_facts reads them."""
        return accumulator


def tagged(tag: str, item: object = None) -> tuple[str, object]:
    """One element of the facts' stream; inputs that only count are tagged without themselves, so
    that only the planned ones travel to the combine (and there, only as partial facts)."""
    return tag, item if tag in (PLANNED, IGNORED_ENTRY, DEAD) else None


def bucket_key(f: InputFile) -> tuple[str, int]:
    """(split, bucket): the group an input is ranked in (planning/hashing.py::bucket_offsets)."""
    assert f.split is not None, "keyed after every input has its split"
    return f.split, bucket_of(shard_digest(f.filename))


def annotation_kinds(f: InputFile) -> tuple[str, ...]:
    """What an input's annotations hold, with "annotated" when it has any."""
    return ("annotated", *f.annotations.own_kinds()) if f.annotations is not None else ()


def coco_category_ids(f: InputFile) -> Iterable[tuple[str, int]]:
    """(class name, COCO category id) of each object that has one."""
    objects = f.annotations.objects if f.annotations is not None else ()
    return [(o.label, o.category_id) for o in objects if o.category_id is not None]


def plan_of_facts(
    facts: PlanFacts,
    *,
    known_labels: tuple[str, ...] = (),
    known_kinds: tuple[str, ...] = (),
    num_shards: int | None,
    example_bytes: int,
    target_shard_bytes: int,
) -> dict:
    """What placing inputs in shards reads: {"layout", "label_names", "annotated"}, with the facts.

    ``known_labels`` and ``known_kinds`` are those of the version appended to: its label ids never
    change (new labels get the next ids, sorted), and what its examples hold stays held."""
    return {
        "layout": split_layout(
            facts.buckets.items(),
            num_shards=num_shards,
            example_bytes=example_bytes,
            target_shard_bytes=target_shard_bytes,
        ),
        "label_names": label_order(facts.labels, known=known_labels),
        "annotated": tuple(sorted(facts.kinds | set(known_kinds))),
        "facts": facts,
    }


def split_layout(
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


def label_order(labels: Iterable[str], *, known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The label names in id order: those of the version appended to first, unchanged, then the
    new ones sorted (a fresh run: all sorted)."""
    return known + tuple(sorted(set(labels) - set(known)))


def plan_summary(
    plan: dict,
    merged_folders: dict,
    *,
    source: str,
    requested: Mapping[str, float] | None,
    split_rule: str,
) -> dict:
    """The plan's small facts: what plan.json records, and what finalize needs.

    ``splits_ignored`` says that --splits was given but no input took it (every input had its
    split already), so that dataset_info.json does not claim fractions that were never applied.
    """
    facts, layout, label_names, annotated = plan["facts"], plan["layout"], plan["label_names"], plan["annotated"]
    if facts.listed == 0:
        raise JobError(f"no image files found in {redact(source)}")
    per_class: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (split, label), count in sorted(facts.classes.items()):
        per_class[split][label] = count
    # An input that joined held examples of two splits was counted without a split, and then took
    # none: it is a dead letter, not one of the inputs the requested fractions were applied to.
    unsplit = facts.unsplit - facts.dead[Reason.NEAR_COPY_ACROSS_SPLITS]
    return {
        "label_names": list(label_names),
        "num_inputs": facts.listed,
        "splits": {
            split: {
                "num_examples": split_facts["count"],
                "num_shards": split_facts["num_shards"],
                "class_counts": dict(sorted(per_class[split].items())),
            }
            for split, split_facts in sorted(layout.items())
        },
        "split_rule": split_rule,
        # Only for annotated datasets: a one-label dataset's plan is as every release wrote it.
        **({"annotated": True, "annotation_kinds": [k for k in annotated if k != "annotated"]} if annotated else {}),
        **({"category_ids": category_id_map(facts.category_ids)} if facts.category_ids else {}),
        "splits_ignored": bool(requested) and unsplit == 0,
        "warnings": plan_warnings(
            per_class, label_names, requested=requested, num_unsplit=unsplit, merged_folders=merged_folders
        ),
    }


def category_id_map(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
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


def ignored_counts(plan: dict) -> Iterator[tuple[str, int]]:
    """(Ignored kind, count) of the entries the listing left out on purpose."""
    yield from sorted(plan["facts"].ignored.items())


def dead_letter_reasons(plan: dict) -> Iterator[tuple[str, int]]:
    """(reason, count) of the listing's and the plan's dead letters."""
    yield from sorted(plan["facts"].dead.items())

"""Planning at cluster scale: the bucket arithmetic, and PlanShards equal to the in-memory plan."""

from __future__ import annotations

import random

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.planning.rules import (
    NUM_BUCKETS,
    bucket_of,
    bucket_offsets,
    place_in_shard,
    plan_dataset,
    shard_digest,
)
from beam_jobs.planning.transforms import PLAN_DEAD_LETTERS, PLAN_SUMMARY, PlanShards
from beam_jobs.records import InputFile

# --- the arithmetic ------------------------------------------------------------------------------


def test_bucket_offsets_are_the_counts_of_lower_buckets():
    assert bucket_offsets({}) == {}
    assert bucket_offsets({7: 1}) == {7: 0}
    # Buckets that hold nothing are absent, and cost nothing.
    assert bucket_offsets({9: 2, 0: 3, 4095: 1}) == {0: 0, 9: 3, 4095: 5}


def test_buckets_follow_the_digest_order():
    names = [f"img{i}.jpg" for i in range(5000)]
    by_digest = sorted(names, key=shard_digest)
    buckets = [bucket_of(shard_digest(n)) for n in by_digest]
    assert buckets == sorted(buckets)
    assert 0 <= min(buckets) and max(buckets) < NUM_BUCKETS


@pytest.mark.parametrize(("num_inputs", "num_shards"), [(1, 1), (5, 1), (5, 5), (7, 3), (100, 8)])
def test_place_in_shard_deals_round_robin(num_inputs, num_shards):
    places = [place_in_shard(rank, num_shards) for rank in range(num_inputs)]
    sizes = [sum(1 for shard, _ in places if shard == s) for s in range(num_shards)]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(places) == sorted(set(places))  # every (shard, position) once
    for shard in range(num_shards):
        assert sorted(p for s, p in places if s == shard) == list(range(sizes[shard]))


def test_place_in_shard_refuses_nonsense():
    with pytest.raises(ValueError):
        place_in_shard(0, 0)
    with pytest.raises(ValueError):
        place_in_shard(-1, 3)


def test_global_rank_from_bucket_offsets_equals_a_global_sort():
    rng = random.Random(3)
    names = [f"{rng.random()}.jpg" for _ in range(3000)]
    counts: dict[int, int] = {}
    for name in names:
        counts[bucket_of(shard_digest(name))] = counts.get(bucket_of(shard_digest(name)), 0) + 1
    offsets = bucket_offsets(counts)
    by_bucket: dict[int, list[str]] = {}
    for name in names:
        by_bucket.setdefault(bucket_of(shard_digest(name)), []).append(name)
    ranks = {
        name: offsets[b] + i
        for b, members in by_bucket.items()
        for i, name in enumerate(sorted(members, key=shard_digest))
    }
    assert [n for n, _ in sorted(ranks.items(), key=lambda kv: kv[1])] == sorted(names, key=shard_digest)


# --- PlanShards against the in-memory reference ----------------------------------------------


def _random_listing(seed: int, *, from_list: bool) -> list[InputFile]:
    """Random inputs: several splits (given or not), classes of one, paths listed twice (same
    label, conflicting labels, with and without a split), content copies."""
    rng = random.Random(seed)
    classes = [f"class{c}" for c in range(rng.randint(1, 12))] + ["lonely"]
    listing = []
    for i in range(rng.randint(1, 400)):
        label = rng.choice(classes[:-1])
        split = rng.choice([None, None, "train", "test"]) if from_list else None
        sha = f"{rng.randrange(60):064x}" if rng.random() < 0.5 else None
        listing.append(
            InputFile(
                f"{label}/{i}.jpg",
                f"/d/{label}/{i}.jpg",
                label=label,
                split=split,
                content_sha256=sha,
                origin=f"/d/list.csv:{i + 2}" if from_list else None,
            )
        )
    listing.append(InputFile("lonely/0.jpg", "/d/lonely/0.jpg", label="lonely"))
    for f in rng.sample(listing, k=min(5, len(listing))):
        listing.append(InputFile(f.filename, f.uri, label=f.label, split=f.split, origin="/d/list.csv:999"))
    for f in rng.sample(listing, k=min(3, len(listing))):
        listing.append(InputFile(f.filename, f.uri, label="other", split=f.split, origin="/d/list.csv:1000"))
    rng.shuffle(listing)
    return listing


def _summary_facts(summary: dict) -> tuple:
    return (
        tuple(summary["label_names"]),
        summary["num_inputs"],
        {k: v["num_shards"] for k, v in summary["splits"].items()},
        tuple(summary["warnings"]),
    )


def _expected_facts(expected) -> tuple:
    return (
        expected.label_names,
        expected.num_inputs,
        {split: expected.num_shards(split) for split in expected.split_names},
        expected.warnings,
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dedup", ["path", "content"])
@pytest.mark.parametrize("split_rule", ["stratified", "hash"])
def test_plan_shards_equals_the_in_memory_plan(seed, dedup, split_rule):
    listing = _random_listing(seed, from_list=True)
    fractions = {"train": 0.6, "validation": 0.3, "test": 0.1}
    num_shards = [None, 1, 3, 50][seed % 4]
    settings = dict(
        split_fractions=fractions,
        num_shards=num_shards,
        example_bytes=20_000,
        target_shard_bytes=400_000,
        dedup=dedup,
        split_rule=split_rule,
    )
    expected = plan_dataset(listing, **settings)
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = (
            p | beam.Create(listing) | PlanShards(from_tree=False, tree_layout="auto", source="/d/list.csv", **settings)
        )
        assert_that(planned["shards"], equal_to(list(expected.shards)), label="Shards")
        assert_that(planned[PLAN_DEAD_LETTERS], equal_to(list(expected.dead_letters)), label="DeadLetters")
        assert_that(
            planned[PLAN_SUMMARY] | beam.Map(_summary_facts), equal_to([_expected_facts(expected)]), label="Summary"
        )


def test_plan_shards_gives_classes_their_exact_shares_across_many_buckets():
    # Enough inputs that every class spans many hash buckets, so that ranks come from offsets.
    rng = random.Random(7)
    listing = [
        InputFile(f"c{c}/{i}.jpg", f"/d/c{c}/{i}.jpg", label=f"c{c}")
        for c in range(5)
        for i in range(rng.randint(300, 1500))
    ]
    fractions = {"train": 0.8, "validation": 0.15, "hold-out": 0.05}
    settings = dict(split_fractions=fractions, num_shards=4, example_bytes=1, target_shard_bytes=1, dedup="path")
    expected = plan_dataset(listing, **settings)
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = p | beam.Create(listing) | PlanShards(from_tree=False, tree_layout="auto", source="/d", **settings)
        assert_that(planned["shards"], equal_to(list(expected.shards)), label="Shards")
        assert_that(
            planned[PLAN_SUMMARY] | beam.Map(lambda s: {k: v["num_examples"] for k, v in s["splits"].items()}),
            equal_to(
                [
                    {
                        "train": round(0.8 * len(listing)),
                        "validation": round(0.15 * len(listing)),
                        "hold-out": len(listing) - round(0.8 * len(listing)) - round(0.15 * len(listing)),
                    }
                ]
            ),
            label="Totals",
        )


def test_plan_shards_of_a_tree_equals_the_in_memory_plan():
    rng = random.Random(11)
    listing = [
        InputFile(f"{split}/{label}/{i}.jpg", f"/t/{split}/{label}/{i}.jpg")
        for i in range(300)
        for split, label in [(rng.choice(["train", "val"]), rng.choice(["a", "b", "c"]))]
    ]
    listing.append(InputFile("train/single/0.jpg", "/t/train/single/0.jpg"))
    listing.append(InputFile("stray.jpg", "/t/stray.jpg"))  # does not fit: a dead letter
    from beam_jobs.planning.rules import labels_from_tree

    labelled, layout_dead = labels_from_tree(listing, "split_label")
    expected = plan_dataset(labelled, num_shards=4, example_bytes=1, dead_letters=layout_dead)
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = (
            p
            | beam.Create(listing)
            | PlanShards(
                from_tree=True,
                tree_layout="split_label",
                source="/t",
                split_fractions=None,
                num_shards=4,
                example_bytes=1,
                target_shard_bytes=1,
                dedup="path",
            )
        )
        assert_that(planned["shards"], equal_to(list(expected.shards)), label="Shards")
        assert_that(planned[PLAN_DEAD_LETTERS], equal_to(list(expected.dead_letters)), label="DeadLetters")


def test_plan_shards_of_a_messy_tree_names_classes_and_splits_as_the_in_memory_plan():
    """Split folders that differ by case, labels in NFC and NFD or with a trailing space, a blank
    label and a label with a newline: the same classes, splits, dead letters and warnings."""
    rng = random.Random(5)
    splits = ["train", "Train", "validation", "VALIDATION"]
    labels = ["caf\u00e9", "cafe\u0301", "cat", "cat ", "dog"]
    listing = [InputFile(f"{rng.choice(splits)}/{rng.choice(labels)}/{i}.jpg", f"/t/{i}.jpg") for i in range(200)]
    listing += [
        InputFile("train/ /blank.jpg", "/t/blank.jpg"),
        InputFile("train/a\nb/nl.jpg", "/t/nl.jpg"),
        InputFile("validation/only_here/1.jpg", "/t/only.jpg"),
    ]
    from beam_jobs.planning.rules import labels_from_tree, merged_split_folders, tree_facts

    labelled, layout_dead = labels_from_tree(listing, "auto")
    merged = merged_split_folders(tree_facts(listing)[1])
    settings = dict(
        split_fractions={"train": 0.5, "validation": 0.5},
        num_shards=2,
        example_bytes=1,
        target_shard_bytes=1,
        dedup="path",
    )
    expected = plan_dataset(labelled, dead_letters=layout_dead, merged_folders=merged, **settings)
    assert expected.label_names == ("caf\u00e9", "cat", "dog", "only_here")
    assert expected.split_names == ("train", "validation")
    assert sorted(d.reason for d in expected.dead_letters) == ["bad_label", "bad_label"]
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = p | beam.Create(listing) | PlanShards(from_tree=True, tree_layout="auto", source="/t", **settings)
        assert_that(planned["shards"], equal_to(list(expected.shards)), label="Shards")
        assert_that(planned[PLAN_DEAD_LETTERS], equal_to(list(expected.dead_letters)), label="DeadLetters")
        assert_that(
            planned[PLAN_SUMMARY] | beam.Map(lambda s: (tuple(s["warnings"]), s["splits_ignored"])),
            equal_to([(expected.warnings, True)]),
            label="Warnings",
        )
    assert any("one split 'train'" in w for w in expected.warnings)
    assert any("one split 'validation'" in w for w in expected.warnings)
    assert any("--splits train,validation was ignored" in w for w in expected.warnings)
    assert any(w.startswith("split 'train' has no example of 1 class: 'only_here'") for w in expected.warnings)


def test_more_shards_than_inputs_gives_one_input_per_shard():
    listing = [InputFile(f"a/{i}.jpg", f"/x/a/{i}.jpg", label="a") for i in range(3)]
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = (
            p
            | beam.Create(listing)
            | PlanShards(
                from_tree=False,
                tree_layout="auto",
                source="/x",
                split_fractions=None,
                num_shards=10,
                example_bytes=1,
                target_shard_bytes=1,
                dedup="path",
            )
        )
        assert_that(planned["shards"] | beam.Map(lambda s: (s.num_shards, len(s.inputs))), equal_to([(3, 1)] * 3))

"""Shard planning: balanced, well mixed, deterministic whatever the listing order."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from beam_jobs.plan import (
    assign_splits,
    labels_from_tree,
    plan_dataset,
    plan_num_shards,
    shard_file_name,
    stable_fraction,
)
from beam_jobs.records import InputFile


def _files(num: int, classes: int = 5) -> list[InputFile]:
    return [InputFile(filename=f"class{i % classes}/img_{i:05d}.jpg", uri=f"/data/class{i % classes}/img_{i:05d}.jpg",
                      label=f"class{i % classes}") for i in range(num)]


@pytest.mark.parametrize("num, shards", [(10, 3), (1000, 7), (999, 10), (5, 5), (64, 1)])
def test_shards_are_balanced_within_one_example(num, shards):
    plan = plan_dataset(_files(num), num_shards=shards, example_bytes=1000)
    sizes = [len(s.inputs) for s in plan.shards]
    assert len(sizes) == shards and sum(sizes) == num and max(sizes) - min(sizes) <= 1


def test_every_shard_is_a_mix_of_classes():
    plan = plan_dataset(_files(1000, classes=5), num_shards=8, example_bytes=1000)
    for shard in plan.shards:
        counts = Counter(f.label for f in shard.inputs)
        assert len(counts) == 5 and min(counts.values()) >= 10
        first_labels = [f.label for f in shard.inputs[:20]]
        assert len(set(first_labels)) >= 3  # Not sorted by class inside the shard either.


def test_plan_does_not_depend_on_listing_order():
    files = _files(500)
    shuffled = files[:]
    random.Random(3).shuffle(shuffled)
    assert plan_dataset(files, num_shards=4, example_bytes=1) == plan_dataset(shuffled, num_shards=4, example_bytes=1)


def test_label_ids_follow_sorted_names():
    files = [InputFile("zebra/1.jpg", "u1", label="zebra"), InputFile("ant/1.jpg", "u2", label="ant"),
             InputFile("Moose/1.jpg", "u3", label="Moose")]
    plan = plan_dataset(files, num_shards=1, example_bytes=1)
    assert plan.label_names == ("Moose", "ant", "zebra")
    assert {f.label: f.label_id for f in plan.shards[0].inputs} == {"Moose": 0, "ant": 1, "zebra": 2}


def test_splits_by_stable_hash_have_the_asked_fractions():
    files = assign_splits(_files(10000), {"train": 0.8, "validation": 0.1, "test": 0.1})
    counts = Counter(f.split for f in files)
    assert abs(counts["train"] - 8000) < 200 and abs(counts["test"] - 1000) < 100
    again = assign_splits(_files(10000), {"train": 0.8, "validation": 0.1, "test": 0.1})
    assert files == again


def test_given_splits_are_kept():
    files = [InputFile("a/1.jpg", "u", label="a", split="test")]
    assert assign_splits(files, {"train": 1.0})[0].split == "test"


def test_tree_layouts():
    labelled, dead = labels_from_tree([InputFile("cat/1.jpg", "u1"), InputFile("dog/2.jpg", "u2")])
    assert [(f.split, f.label) for f in labelled] == [(None, "cat"), (None, "dog")] and not dead
    labelled, dead = labels_from_tree([InputFile("train/cat/1.jpg", "u1"), InputFile("test/dog/2.jpg", "u2")])
    assert [(f.split, f.label) for f in labelled] == [("test", "dog"), ("train", "cat")] and not dead
    labelled, dead = labels_from_tree([InputFile("cat/1.jpg", "u1"), InputFile("loose.jpg", "u2"),
                                       InputFile("a/b/c/d.jpg", "u3")])
    assert [f.label for f in labelled] == ["cat"]
    assert sorted(d.uri for d in dead) == ["u2", "u3"] and {d.reason for d in dead} == {"unexpected_layout"}


def test_duplicates_become_dead_letters_not_doubles():
    files = _files(10) + _files(2)
    plan = plan_dataset(files, num_shards=2, example_bytes=1)
    assert sum(len(s.inputs) for s in plan.shards) == 10
    assert [d.reason for d in plan.dead_letters] == ["duplicate_input"] * 2
    assert plan.num_inputs == 12


@pytest.mark.parametrize(
    "num, example_bytes, target, expected",
    [
        (100, 30_000, 150 * 2**20, 1),  # Small: one shard.
        (64 * 40, 30_000, 150 * 2**20, 32),  # Medium: enough shards for 32 workers.
        (100_000, 30_000, 150 * 2**20, 32),  # 2.9 GB: still 32, about 90 MB each.
        (1_000_000, 30_000, 150 * 2**20, 191),  # 28.6 GB: by size.
        (0, 30_000, 150 * 2**20, 0),
    ],
)
def test_num_shards_from_target_size(num, example_bytes, target, expected):
    assert plan_num_shards(num, example_bytes=example_bytes, target_shard_bytes=target) == expected


def test_names_and_fractions():
    assert shard_file_name("train", 3, 16) == "train-00003-of-00016.tfrecord"
    assert 0.0 <= stable_fraction("a/b.jpg") < 1.0
    assert stable_fraction("a/b.jpg") == stable_fraction("a/b.jpg") != stable_fraction("a/c.jpg")

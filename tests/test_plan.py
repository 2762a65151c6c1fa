"""Shard planning: balanced, well mixed, deterministic whatever the listing order."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from beam_jobs.planning.rules import (
    assign_splits,
    labels_from_tree,
    plan_dataset,
    plan_num_shards,
    shard_file_name,
    stable_fraction,
)
from beam_jobs.records import InputFile


def _files(num: int, classes: int = 5) -> list[InputFile]:
    return [
        InputFile(
            filename=f"class{i % classes}/img_{i:05d}.jpg",
            uri=f"/data/class{i % classes}/img_{i:05d}.jpg",
            label=f"class{i % classes}",
        )
        for i in range(num)
    ]


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
    files = [
        InputFile("zebra/1.jpg", "u1", label="zebra"),
        InputFile("ant/1.jpg", "u2", label="ant"),
        InputFile("Moose/1.jpg", "u3", label="Moose"),
    ]
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
    labelled, dead = labels_from_tree(
        [InputFile("cat/1.jpg", "u1"), InputFile("loose.jpg", "u2"), InputFile("a/b/c/d.jpg", "u3")]
    )
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


# --- one label and split-name policy for trees -------------------------------------------------


def test_tree_labels_that_read_the_same_are_one_class():
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    listing = [
        InputFile(f"{nfc}/1.jpg", "u1"),
        InputFile(f"{nfd}/2.jpg", "u2"),
        InputFile("cat/3.jpg", "u3"),
        InputFile("cat /4.jpg", "u4"),
        InputFile(" cat/5.jpg", "u5"),
    ]
    labelled, dead = labels_from_tree(listing)
    assert not dead
    assert sorted({f.label for f in labelled}) == ["caf\u00e9", "cat"]
    plan = plan_dataset(labelled, num_shards=1, example_bytes=1)
    assert plan.label_names == ("caf\u00e9", "cat")


@pytest.mark.parametrize("folder", ["   ", "cat\ndog", "tab\there", "line\u2028sep"])
def test_a_tree_label_that_cannot_be_one_is_a_dead_letter_naming_the_file(folder):
    labelled, dead = labels_from_tree(
        [InputFile(f"{folder}/1.jpg", "/d/bad/1.jpg"), InputFile("ok/2.jpg", "/d/ok/2.jpg")]
    )
    assert [f.label for f in labelled] == ["ok"]
    assert [(d.uri, d.reason) for d in dead] == [("/d/bad/1.jpg", "bad_label")]
    assert repr(f"{folder}/1.jpg") in dead[0].detail


def test_split_folders_that_differ_only_by_case_are_one_split():
    listing = [
        InputFile("validation/a/1.jpg", "u1"),
        InputFile("Validation/a/2.jpg", "u2"),
        InputFile("TRAIN/a/3.jpg", "u3"),
        InputFile("train/b/4.jpg", "u4"),
        InputFile("Validation/b/5.jpg", "u5"),
    ]
    labelled, dead = labels_from_tree(listing)
    assert not dead
    assert sorted((f.split, f.filename) for f in labelled) == [
        ("train", "TRAIN/a/3.jpg"),
        ("train", "train/b/4.jpg"),
        ("validation", "Validation/a/2.jpg"),
        ("validation", "Validation/b/5.jpg"),
        ("validation", "validation/a/1.jpg"),
    ]
    plan = plan_dataset(labelled, num_shards=1, example_bytes=1)
    assert plan.split_names == ("train", "validation")
    assert sum(len(s.inputs) for s in plan.shards if s.split == "validation") == 3


def test_merged_split_folders_are_a_plan_warning():
    from beam_jobs.planning.rules import merged_split_folders

    merged = merged_split_folders({"validation", "Validation", "train", "bad name"})
    assert merged == {"validation": ["Validation", "validation"]}
    plan = plan_dataset(
        [InputFile("validation/a/1.jpg", "u1", label="a", split="validation")],
        num_shards=1,
        example_bytes=1,
        merged_folders=merged,
    )
    assert any("'Validation', 'validation'" in w and "one split 'validation'" in w for w in plan.warnings)


# --- exact, stratified splits ------------------------------------------------------------------


def _split_counts(plan) -> dict[str, Counter]:
    counts: dict[str, Counter] = {}
    for shard in plan.shards:
        counts.setdefault(shard.split, Counter()).update(f.label for f in shard.inputs)
    return counts


def test_150_images_at_09_01_give_exactly_135_and_15_with_every_class_in_both():
    # 150 images over 9 classes of unequal size, as in a user's tree.
    sizes = [30, 25, 20, 20, 15, 15, 10, 10, 5]
    files = [
        InputFile(f"c{c}/{i}.jpg", f"/d/c{c}/{i}.jpg", label=f"c{c}") for c, n in enumerate(sizes) for i in range(n)
    ]
    plan = plan_dataset(files, split_fractions={"train": 0.9, "validation": 0.1}, num_shards=2, example_bytes=1)
    counts = _split_counts(plan)
    assert sum(counts["train"].values()) == 135 and sum(counts["validation"].values()) == 15
    for c, n in enumerate(sizes):
        assert counts["train"][f"c{c}"] + counts["validation"][f"c{c}"] == n
        assert counts["validation"][f"c{c}"] >= 1
        assert abs(counts["validation"][f"c{c}"] - n * 0.1) < 1
    assert plan.warnings == ()


@pytest.mark.parametrize("seed", range(40))
def test_stratified_counts_hold_both_totals_and_every_class_in_every_split(seed):
    from fractions import Fraction

    from beam_jobs.planning.rules import split_quotas, stratified_counts

    rng = random.Random(seed)
    sizes = {f"c{i}": rng.choice([1, 2, 3, 4, 7, 20, 90]) for i in range(rng.randint(1, 20))}
    weights = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
    fractions = {f"s{j}": w / sum(weights) for j, w in enumerate(weights)}
    counts = stratified_counts(sizes, fractions)
    total = sum(sizes.values())
    quotas = split_quotas(total, fractions)
    assert sum(quotas.values()) == total
    for split, fraction in fractions.items():
        assert abs(quotas[split] - fraction * total) < 1
        assert sum(counts[c][split] for c in sizes) == quotas[split]
    eligible = [c for c, n in sizes.items() if n >= len(fractions)]
    for c, n in sizes.items():
        assert sum(counts[c].values()) == n and min(counts[c].values()) >= 0
    for split in fractions:
        present = sum(1 for c in eligible if counts[c][split] >= 1)
        assert present == min(len(eligible), quotas[split])
    if all(Fraction(n * quotas[s], total) >= 1 for n in sizes.values() for s in fractions):
        # No lower bound has to bind: every cell is its ideal share, rounded one way or the other.
        assert all(abs(counts[c][s] - Fraction(n * quotas[s], total)) < 1 for c, n in sizes.items() for s in fractions)
    assert counts == stratified_counts(dict(reversed(list(sizes.items()))), fractions)


def test_stratified_splits_do_not_depend_on_listing_order():
    files = _files(537, classes=7)
    shuffled = files[:]
    random.Random(5).shuffle(shuffled)
    fractions = {"train": 0.7, "validation": 0.2, "test": 0.1}
    assert plan_dataset(files, split_fractions=fractions, num_shards=3, example_bytes=1) == plan_dataset(
        shuffled, split_fractions=fractions, num_shards=3, example_bytes=1
    )


@pytest.mark.parametrize("added", [1, 5, 30])
def test_adding_inputs_to_a_class_moves_few_existing_ones(added):
    fractions = {"train": 0.8, "validation": 0.1, "test": 0.1}
    before = _files(600, classes=6)
    grown = before + [
        InputFile(f"class0/new_{i}.jpg", f"/data/class0/new_{i}.jpg", label="class0") for i in range(added)
    ]
    old = {f.filename: f.split for f in assign_splits(before, fractions)}
    new = {f.filename: f.split for f in assign_splits(grown, fractions)}
    moved = Counter(name.split("/")[0] for name in old if old[name] != new[name])
    boundaries = len(fractions) - 1
    assert moved["class0"] <= boundaries * (added + 2)
    assert all(moved[f"class{c}"] <= boundaries * 2 for c in range(1, 6))


def test_the_hash_rule_keeps_each_inputs_own_hash_split():
    fractions = {"train": 0.9, "validation": 0.1}
    plan = plan_dataset(
        _files(150, classes=9), split_fractions=fractions, num_shards=1, example_bytes=1, split_rule="hash"
    )
    for shard in plan.shards:
        for f in shard.inputs:
            assert f.split == ("train" if stable_fraction(f.filename, "split") < 0.9 else "validation")


def test_given_splits_take_no_part_in_the_fractions():
    given = [InputFile(f"a/g{i}.jpg", f"u{i}", label="a", split="test") for i in range(50)]
    plan = plan_dataset(
        given + _files(100, classes=4), split_fractions={"train": 0.8, "validation": 0.2}, num_shards=1, example_bytes=1
    )
    counts = _split_counts(plan)
    assert sum(counts["test"].values()) == 50
    assert sum(counts["train"].values()) == 80 and sum(counts["validation"].values()) == 20


def test_a_class_missing_from_a_split_and_an_empty_requested_split_are_warnings():
    files = _files(40, classes=4) + [InputFile("lonely/0.jpg", "/data/lonely/0.jpg", label="lonely")]
    plan = plan_dataset(
        files, split_fractions={"train": 0.9, "validation": 0.09, "test": 0.01}, num_shards=1, example_bytes=1
    )
    assert plan.split_names == ("train", "validation")
    assert any("'test'" in w and "none of the 41 inputs" in w for w in plan.warnings)
    assert any(w.startswith("split 'validation' has no example of 1 class: 'lonely'") for w in plan.warnings)


def test_splits_for_inputs_that_all_have_one_are_a_warning():
    files = [InputFile(f"train/a/{i}.jpg", f"u{i}", label="a", split="train") for i in range(3)]
    plan = plan_dataset(files, split_fractions={"train": 0.5, "validation": 0.5}, num_shards=1, example_bytes=1)
    assert any("was ignored" in w for w in plan.warnings)


def test_classes_that_differ_only_by_case_stay_apart_with_a_warning():
    labelled, _ = labels_from_tree(
        [InputFile("Dog/1.jpg", "u1"), InputFile("dog/2.jpg", "u2"), InputFile("cat/3.jpg", "u3")]
    )
    plan = plan_dataset(labelled, num_shards=1, example_bytes=1)
    assert plan.label_names == ("Dog", "cat", "dog")
    assert plan.warnings == ("the classes 'Dog', 'dog' differ only by case; they are separate classes",)


_NUMERIC_ORDER_WARNING = (
    "labels look like numbers but ids follow sorted text order ('10' has id 2); "
    "dataset_info.json's label_names maps ids to names (Keras does the same); "
    "name them 00, 01, ... to keep numeric order"
)


def test_labels_that_look_like_numbers_out_of_numeric_order_are_a_warning():
    files = [InputFile(f"{n}/{i}.jpg", f"/d/{n}/{i}.jpg", label=str(n)) for n in range(12) for i in range(2)]
    plan = plan_dataset(files, num_shards=1, example_bytes=1)
    assert plan.label_names[:5] == ("0", "1", "10", "11", "2")
    assert plan.warnings == (_NUMERIC_ORDER_WARNING,)


@pytest.mark.parametrize("labels", [[str(n) for n in range(10)], [f"{n:02d}" for n in range(12)], ["2", "10", "cat"]])
def test_labels_whose_text_order_is_their_numeric_order_or_not_all_numbers_are_no_warning(labels):
    files = [InputFile(f"{label}/0.jpg", f"/d/{label}/0.jpg", label=label) for label in labels]
    assert plan_dataset(files, num_shards=1, example_bytes=1).warnings == ()

"""Splits and class names through the CLI: exact, stratified fractions; one policy for names; every
surprise said on the console and recorded in dataset_info.json."""

from __future__ import annotations

import json
import pathlib
import shutil
import unicodedata

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli
from tests.dataset_files import dead_letters_path

pytestmark = pytest.mark.slow

FLAGS = ["--image_size", "32", "--num_shards", "1"]


def _info(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def _dead(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in dead_letters_path(out).read_text().splitlines() if line]


def test_150_images_split_exactly_135_and_15_with_every_class_in_both(tmp_path):
    photos, out = tmp_path / "photos", tmp_path / "out"
    make_photo_tree(photos, num_images=150, size=(64, 48), seed=4)
    run_cli("--input", photos, "--output_dir", out, "--splits", "train=0.9,validation=0.1", *FLAGS)
    info = _info(out)
    assert {name: s["num_examples"] for name, s in info["splits"].items()} == {"train": 135, "validation": 15}
    for label in info["label_names"]:
        total = info["splits"]["train"]["class_counts"][label] + info["splits"]["validation"]["class_counts"][label]
        assert info["splits"]["validation"]["class_counts"][label] >= 1
        assert abs(info["splits"]["validation"]["class_counts"][label] - total * 0.1) < 1
    assert info["preprocessing"]["split_rule"] == "stratified" and info["warnings"] == []
    # The rule is a setting of the dataset: --resume with the other rule is refused, naming it.
    refused = run_cli(
        "--input",
        photos,
        "--output_dir",
        out,
        "--splits",
        "train=0.9,validation=0.1",
        "--split_rule",
        "hash",
        "--resume",
        *FLAGS,
        check=False,
    )
    assert refused.returncode == 2 and "split_rule" in refused.stderr


def test_the_hash_rule_is_kept_behind_a_flag(tmp_path):
    photos, out = tmp_path / "photos", tmp_path / "out"
    make_photo_tree(photos, num_images=40, size=(64, 48), seed=4)
    run_cli(
        "--input",
        photos,
        "--output_dir",
        out,
        "--splits",
        "train=0.9,validation=0.1",
        "--split_rule",
        "hash",
        "--max_bad_fraction",
        "0",
        *FLAGS,
    )
    info = _info(out)
    assert info["preprocessing"]["split_rule"] == "hash"
    assert sum(s["num_examples"] for s in info["splits"].values()) == 40


def _copy(source: pathlib.Path, target: pathlib.Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def test_a_messy_split_tree_is_one_set_of_classes_and_splits_and_says_what_it_did(tmp_path):
    """Validation/ and validation/, café in NFC and NFD, 'cat' and 'cat ', a blank and a newline
    folder, a class only in train, and --splits that the tree's own splits override."""
    sample, root, out = tmp_path / "sample", tmp_path / "tree", tmp_path / "out"
    images = make_photo_tree(sample, num_images=24, size=(64, 48), seed=6)
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    places = [
        ("train", nfc),
        ("train", nfd),
        ("train", "cat"),
        ("train", "cat "),
        ("train", "only_train"),
        ("validation", nfc),
        ("Validation", nfd),
        ("validation", "cat"),
        ("Validation", "cat "),
    ]
    for index, image in enumerate(images[:18]):
        split, label = places[index % len(places)]
        _copy(image, root / split / label / f"{index}.jpg")
    _copy(images[18], root / "train" / " " / "blank.jpg")
    _copy(images[19], root / "train" / "a\nb" / "newline.jpg")
    result = run_cli(
        "--input",
        root,
        "--output_dir",
        out,
        "--splits",
        "train=0.5,validation=0.5",
        "--max_bad_fraction",
        "0.2",
        *FLAGS,
    )
    info = _info(out)
    assert info["label_names"] == [nfc, "cat", "only_train"]
    assert {name: s["num_examples"] for name, s in info["splits"].items()} == {"train": 10, "validation": 8}
    assert info["splits"]["validation"]["class_counts"] == {nfc: 4, "cat": 4, "only_train": 0}
    assert info["preprocessing"]["splits"] is None  # ignored, so not claimed
    bad = sorted((d["uri"].rsplit("/", 2)[-2], d["reason"]) for d in _dead(out))
    assert bad == [(" ", "bad_label"), ("a\nb", "bad_label")]
    console = result.stdout + result.stderr
    for says in [
        "the split folders 'Validation', 'validation' are one split 'validation'",
        "--splits train,validation was ignored",
        "split 'validation' has no example of 1 class: 'only_train'",
    ]:
        assert any(says in w for w in info["warnings"]), (says, info["warnings"])
        assert f"WARNING: {says}" in console, console


def test_a_requested_split_that_receives_nothing_is_a_warning_in_the_plan(tmp_path):
    photos, out = tmp_path / "photos", tmp_path / "plan"
    make_photo_tree(photos, num_images=9, size=(64, 48), seed=2, classes=["chelsea", "coffee", "rocket"])
    result = run_cli(
        "--input",
        photos,
        "--output_dir",
        out,
        "--plan_only",
        "--splits",
        "train=0.9,validation=0.05,hold-out=0.05",
        *FLAGS,
    )
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(plan["splits"]) == ["train", "validation"]
    says = "--splits asks for 'hold-out', but none of the 9 inputs without a split went to it"
    assert any(w.startswith(says) for w in plan["warnings"])
    assert f"WARNING: {says}" in result.stdout


def test_a_class_whose_examples_of_a_split_are_all_dead_letters_is_a_warning(tmp_path):
    from tests.photos import encode, real_photo

    sample, root, out = tmp_path / "sample", tmp_path / "tree", tmp_path / "out"
    images = make_photo_tree(sample, num_images=6, size=(64, 48), seed=3)
    for index, image in enumerate(images[:4]):
        _copy(image, root / "train" / ("a" if index % 2 else "b") / f"{index}.jpg")
    _copy(images[4], root / "validation" / "b" / "4.jpg")
    (root / "validation" / "a").mkdir(parents=True)
    (root / "validation" / "a" / "cut.jpg").write_bytes(encode(real_photo(), "JPEG")[:300])  # truncated
    result = run_cli("--input", root, "--output_dir", out, "--max_bad_fraction", "0.5", *FLAGS)
    info = _info(out)
    assert info["splits"]["validation"]["class_counts"] == {"a": 0, "b": 1}
    says = "split 'validation' has no example left of 'a': every input of it there is a dead letter"
    assert says in info["warnings"]
    # The plan could not know it, so the console says it at the end, after the table.
    assert f"WARNING: {says}" in result.stdout[result.stdout.index("\ntotal ") :], result.stdout

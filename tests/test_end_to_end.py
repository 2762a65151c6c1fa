"""The CLI end to end, on a tree of real photos plus broken files, read back with plain tf.data."""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections import Counter

import pytest
import tensorflow as tf

from beam_jobs.imaging.example import FEATURE_DTYPES
from beam_jobs.listing.discover import is_image_filename
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli as _run_cli
from tests.dataset_files import current_files, dead_letters, dead_letters_path

pytestmark = pytest.mark.slow

_TF_DTYPES = {"string": tf.string, "int64": tf.int64}


def run_cli(*args: object, **kwargs: object):
    """The job as a user runs it, with Beam's worker processes: this module's subject needs them."""
    return _run_cli(*args, processes=True, **kwargs)


def _read_all(output_dir: pathlib.Path, info: dict) -> dict:
    """Parses every shard with TFRecordDataset + parse_example, keyed by filename."""
    spec = {key: tf.io.FixedLenFeature([], _TF_DTYPES[dtype]) for key, dtype in FEATURE_DTYPES.items()}
    records = {}
    for split, meta in info["splits"].items():
        for index, shard in enumerate(meta["shards"]):
            dataset = tf.data.TFRecordDataset(str(output_dir / shard["file"])).batch(64)
            for batch in dataset.map(lambda b: tf.io.parse_example(b, spec)):
                for i in range(len(batch["image/filename"])):
                    name = batch["image/filename"][i].numpy().decode("utf-8")
                    assert name not in records, f"{name} appears twice"
                    records[name] = {key: batch[key][i].numpy() for key in FEATURE_DTYPES}
                    records[name].update(split=split, shard=index)
    return records


def _planned_shards_of(root: pathlib.Path, broken: dict) -> Counter:
    """Which (split, shard) the planner gave each broken file, from the pure planning function."""
    all_inputs = [
        InputFile(str(p.relative_to(root)), str(p), label=p.parent.name)
        for p in root.rglob("*")
        if p.is_file() and is_image_filename(p.name)
    ]
    full = plan_dataset(all_inputs, split_fractions={"train": 0.75, "validation": 0.25}, num_shards=3, example_bytes=1)
    return Counter((s.split, s.index) for s in full.shards for f in s.inputs if f.uri in broken)


@pytest.fixture(scope="module")
def converted(photo_tree, tmp_path_factory):
    root, good, broken = photo_tree
    out = tmp_path_factory.mktemp("out")
    result = run_cli(
        "--input",
        root,
        "--output_dir",
        out,
        "--image_size",
        "64x48",
        "--num_shards",
        "3",
        "--splits",
        "train=0.75,validation=0.25",
        "--max_bad_fraction",
        "0.5",
    )
    return root, good, broken, out, result


def test_every_good_photo_appears_exactly_once_with_its_label_and_size(converted):
    root, good, broken, out, _ = converted
    info = json.loads((out / "dataset_info.json").read_text())
    records = _read_all(out, info)
    assert sorted(records) == sorted(str(p.relative_to(root)) for p in good)
    for name, record in records.items():
        label = name.split("/")[0]
        assert record["image/class/text"].decode() == label
        assert info["label_names"][record["image/class/label"]] == label
        assert record["image/format"] == b"JPEG"
        assert record["image/key/sha256"].decode() == hashlib.sha256((root / name).read_bytes()).hexdigest()
        image = tf.io.decode_jpeg(record["image/encoded"])
        assert image.shape == (48, 64, 3)
        assert (record["image/height"], record["image/width"], record["image/channels"]) == (48, 64, 3)


def test_manifest_describes_the_shards(converted):
    root, good, broken, out, result = converted
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["label_names"] == sorted({p.parent.name for p in good})
    assert sum(s["num_examples"] for s in info["splits"].values()) == len(good)
    for split, meta in info["splits"].items():
        run = f"shards/{info['change']['run']}"
        assert [s["file"] for s in meta["shards"]] == [f"{run}/{split}-{i:05d}-of-00003.tfrecord" for i in range(3)]
        for shard in meta["shards"]:
            data = (out / shard["file"]).read_bytes()
            assert shard["bytes"] == len(data) and shard["sha256"] == hashlib.sha256(data).hexdigest()
            assert shard["num_examples"] == sum(1 for _ in tf.data.TFRecordDataset(str(out / shard["file"])))
    # Shards are balanced by planned inputs; the broken ones are missing from whichever shard they fell in.
    planned = Counter()
    for record in _read_all(out, info).values():
        planned[(record["split"], record["shard"])] += 1
    shard_of_broken = _planned_shards_of(root, broken)
    for key, count in shard_of_broken.items():
        planned[key] += count
    for split in info["splits"]:
        sizes = [planned[(split, i)] for i in range(3)]
        assert max(sizes) - min(sizes) <= 1, sizes
    assert set(info["features"]) == set(FEATURE_DTYPES) and info["producer"]["version"]
    assert info["preprocessing"]["image_size"] == "64x48"  # as --image_size took it (WIDTHxHEIGHT)
    assert "wrote" in result.stdout


def test_every_broken_file_is_a_dead_letter(converted):
    root, good, broken, out, _ = converted
    dead = dead_letters(out)
    assert {d["uri"]: d["reason"] for d in dead} == broken
    assert all(d["stage"] and d["detail"] for d in dead)
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["num_dead_letters"] == len(broken)


def test_no_temporary_or_extra_files_are_left(converted):
    out = converted[3]
    info = json.loads((out / "dataset_info.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == [".commit.lock", "dataset_info.json", "shards", "versions"]
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["00000001.json"]
    [folder] = (out / "shards").iterdir()
    assert folder.name == info["change"]["run"]
    shards = [f"{s}-{i:05d}-of-00003.tfrecord" for s in ("train", "validation") for i in range(3)]
    # Each shard's sidecar stays: it records which inputs the shard holds (--append, --resume).
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["dead_letters.jsonl", *shards, *(f".{name}.json" for name in shards)]
    )


def test_a_second_run_is_byte_identical(converted, tmp_path):
    root, _, _, out, _ = converted
    run_cli(
        "--input",
        root,
        "--output_dir",
        tmp_path,
        "--image_size",
        "64x48",
        "--num_shards",
        "3",
        "--splits",
        "train=0.75,validation=0.25",
        "--max_bad_fraction",
        "0.5",
        "--direct_running_mode",
        "in_memory",
    )  # The other local mode: one process converting on threads, where the first run had two workers.
    again = current_files(tmp_path)
    for name, data in current_files(out).items():
        assert again[name] == data, name


def test_too_many_bad_inputs_fail_loudly_and_write_no_manifest(photo_tree, tmp_path):
    root, good, broken = photo_tree
    result = run_cli("--input", root, "--output_dir", tmp_path, "--image_size", "32", check=False)
    assert result.returncode == 1
    assert f"{len(broken)} of {len(good) + len(broken)} inputs" in result.stderr
    assert "dead_letters.jsonl" in result.stderr
    assert not (tmp_path / "dataset_info.json").exists()
    assert str(dead_letters_path(tmp_path)) in result.stderr
    assert len(dead_letters(tmp_path)) == len(broken)


def test_manifest_input_with_splits_non_ascii_names_and_png_output(tmp_path):
    photos = make_photo_tree(tmp_path / "src", num_images=12, seed=4)
    renamed = []
    for i, path in enumerate(photos):
        target = path.with_name(f"фото ün {i}.JPG")
        path.rename(target)
        renamed.append(target)
    lines = ["uri,label,split"] + [
        f"src/{p.parent.name}/{p.name},{p.parent.name},{'test' if i % 4 == 0 else 'train'}"
        for i, p in enumerate(renamed)
    ]
    lines.append("src/missing.jpg,ghost,train")
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    run_cli(
        "--manifest",
        manifest,
        "--output_dir",
        out,
        "--image_size",
        "40",
        "--encoding",
        "png",
        "--channels",
        "1",
        "--resize_mode",
        "pad",
        "--max_bad_fraction",
        "0.2",
    )
    info = json.loads((out / "dataset_info.json").read_text())
    assert {name: s["num_examples"] for name, s in info["splits"].items()} == {"test": 3, "train": 9}
    records = _read_all(out, info)
    assert sorted(records) == sorted(f"src/{p.parent.name}/{p.name}" for p in renamed)
    assert all(tf.io.decode_png(r["image/encoded"]).shape == (40, 40, 1) for r in records.values())
    dead = dead_letters(out)
    assert [(d["uri"].endswith("src/missing.jpg"), d["reason"]) for d in dead] == [(True, "read_error")]


def test_existing_dataset_is_not_mixed_with_a_new_one(converted):
    root, _, _, out, _ = converted
    result = run_cli("--input", root, "--output_dir", out, check=False)
    assert result.returncode == 2 and "--overwrite" in result.stderr and "--resume" in result.stderr


def test_help_lists_the_flags():
    result = run_cli("--help")
    for flag in (
        "--input",
        "--manifest",
        "--output_dir",
        "--image_size",
        "--resize_mode",
        "--encoding",
        "--num_shards",
        "--target_shard_mb",
        "--max_bad_fraction",
        "--runner",
    ):
        assert flag in result.stdout

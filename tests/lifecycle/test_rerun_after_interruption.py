"""A plain rerun after an interrupted run says that --resume would have kept its shards, and a
--resume continues only a run folder made for what it does (every input, or an append to one version)."""

from __future__ import annotations

import json
import shutil

import pytest

from beam_jobs.records import ShardResult
from beam_jobs.sample_data import make_photo_tree
from beam_jobs.writing.finalize import _remove_unlisted_shards
from tests.conftest import run_cli

_HINT = "an interrupted earlier run"


def test_a_plain_rerun_names_the_shards_of_an_interrupted_run_that_resume_would_keep(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=8, size=(120, 90), seed=3)
    out = tmp_path / "out"
    flags = ["--input", photos, "--output_dir", out, "--image_size", "32", "--num_shards", "2"]
    first = run_cli(*flags)
    assert _HINT not in first.stderr
    # A run killed just before its commit: complete shards in its run folder, no version lists it.
    (out / "dataset_info.json").unlink()
    shutil.rmtree(out / "versions")
    rerun = run_cli(*flags)
    assert _HINT in rerun.stderr and "--resume" in rerun.stderr
    # Other settings: nothing --resume could keep, so nothing to say.
    (out / "dataset_info.json").unlink()
    shutil.rmtree(out / "versions")
    other = run_cli("--input", photos, "--output_dir", out, "--image_size", "48", "--num_shards", "2")
    assert _HINT not in other.stderr


@pytest.mark.slow
def test_an_append_resume_never_continues_an_interrupted_overwrites_folder(tmp_path):
    """An overwrite killed with its shards written, then `--append --resume`: the append continued
    the overwrite's folder and committed its validation shard unlisted, so the version failed
    verify-tfrecords and make_dataset. It now keeps none of them, saying what they were made for."""
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel

    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=12, size=(120, 90), seed=5, classes=["china", "coffee"])
    out, beside = tmp_path / "out", tmp_path / "beside"
    flags = ["--input", photos, "--image_size", "24", "--splits", "train=0.75,validation=0.25"]
    run_cli(*flags, "--output_dir", out)
    # An overwrite whose shards all exist but which never committed: made beside, copied in.
    shutil.copytree(out, beside)
    run_cli(*flags, "--output_dir", beside, "--overwrite")
    [overwrite_run] = {p.name for p in (beside / "shards").iterdir()} - {p.name for p in (out / "shards").iterdir()}
    shutil.copytree(beside / "shards" / overwrite_run, out / "shards" / overwrite_run)
    make_photo_tree(photos, num_images=1, size=(120, 90), seed=6, classes=["rocket"])  # one new class
    appended = run_cli(*flags, "--output_dir", out, "--append", "--resume")
    assert "made for a run of every input, not an --append to version 1" in appended.stderr, appended.stderr
    assert "Found 1 new image" in appended.stderr, appended.stderr
    assert tfr.verify(str(out)) == []
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["version"] == 2 and sum(s["num_examples"] for s in manifest["splits"].values()) == 13
    assert (
        sum(1 for _ in tfr.make_dataset(str(out), "validation", 1)) == manifest["splits"]["validation"]["num_examples"]
    )


def test_a_committed_run_folder_keeps_only_the_shards_its_run_lists(tmp_path):
    names = ["train-00000-of-00001.tfrecord", "validation-00000-of-00001.tfrecord", "mine.tfrecord", "notes.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / f".{name}.json").write_text("{}")
    listed = ShardResult(split="train", index=0, num_shards=1, file=names[0], num_examples=1, bytes=1, sha256="0" * 64)
    _remove_unlisted_shards(str(tmp_path), [listed])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [names[0], f".{names[0]}.json", "mine.tfrecord", ".mine.tfrecord.json", "notes.txt", ".notes.txt.json"]
    )

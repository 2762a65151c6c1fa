"""Label ids belong to the dataset's lineage: the first version sorts the names, and every later
version of the same output folder (--overwrite, --append, a rollback, and overwrites after it)
keeps each label's id; new labels take new ids at the end, a removed label's id is never given to
another, and renumbering is an explicit --relabel sorted that says what it changed. Each case is
one a user hit: an overwrite after an append permuted ids with no word, and a model trained on
one version read another's labels."""

from __future__ import annotations

import collections
import pathlib
import shutil
import subprocess
import sys

import pytest

from beam_jobs.errors import UsageError
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO, run_cli
from tests.lifecycle.checks import examples_of_manifest, examples_read, manifest, verify_clean


def test_relabel_sorted_is_refused_with_append_by_the_command_line_and_the_python_call(tmp_path):
    refused = run_cli(
        "--input", tmp_path, "--output_dir", tmp_path / "out", "--append", "--relabel", "sorted", check=False
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--relabel sorted" in refused.stderr and "--append" in refused.stderr, refused.stderr[-2000:]
    from beam_jobs import convert

    with pytest.raises(UsageError, match=r"relabel.*sorted.*append"):
        convert(str(tmp_path), output_dir=str(tmp_path / "out"), append=True, relabel="sorted")
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def _job(photos: pathlib.Path, out: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    # Every version's files are kept, so that any of them can be rolled back to.
    return run_cli("--input", photos, "--output_dir", out, "--image_size", "24", "--keep_versions", "9", *flags)


def _rollback(out: pathlib.Path, version: int) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs.versions", str(out), "rollback", str(version)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _add_class(photos: pathlib.Path, scratch: pathlib.Path, name: str, num_images: int = 3) -> None:
    for photo in make_photo_tree(scratch / name, num_images=num_images, seed=5, classes=[name]):
        (photos / name).mkdir(exist_ok=True)
        photo.rename(photos / name / photo.name)


def _read_right(out: pathlib.Path) -> None:
    """Every example, read record by record and through the reader, carries the name of its own
    class folder, and the files check out."""
    info = manifest(out)
    on_disk = examples_of_manifest(out, info)
    assert on_disk == examples_read(out)
    assert all(filename.split("/")[0] == name for (_, filename, name) in on_disk), on_disk
    verify_clean(out)


def _said(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


@pytest.mark.slow
def test_overwrite_append_rollback_and_overwrite_again_keep_every_label_id(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=6, seed=2, classes=["china", "coffee"])
    out = tmp_path / "out"
    _job(photos, out)
    _add_class(photos, tmp_path / "more", "astronaut")  # sorts first: a sorted renumbering would move every id
    appended = _job(photos, out, "--append")
    assert manifest(out)["label_names"] == ["china", "coffee", "astronaut"]
    overwritten = _job(photos, out, "--overwrite")
    info = manifest(out)
    assert info["version"] == 3 and info["label_names"] == ["china", "coffee", "astronaut"], info["label_names"]
    assert "label ids: 'astronaut' is new with id 2" in _said(appended), _said(appended)[-3000:]
    assert "label ids" not in _said(overwritten), _said(overwritten)[-3000:]  # nothing changed: nothing said
    _read_right(out)
    said = _rollback(out, 1)
    assert "'astronaut' (id 2) is dropped" in said, said
    assert manifest(out)["label_names"] == ["china", "coffee"]
    # After the rollback, the id version 2 gave 'astronaut' is still its id, and the line says so.
    again = _job(photos, out, "--overwrite")
    assert manifest(out)["label_names"] == ["china", "coffee", "astronaut"]
    assert "label ids: 'astronaut' is new with id 2" in _said(again), _said(again)[-3000:]
    assert manifest(out)["change"]["label_ids"] == "label ids: 'astronaut' is new with id 2"
    _read_right(out)


@pytest.mark.slow
def test_a_removed_label_keeps_its_id_unused_and_every_example_reads_with_its_name(tmp_path):
    import tfdata_readers as tfr

    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=12, seed=2, classes=["astronaut", "china", "coffee"])
    out = tmp_path / "out"
    splits = ("--splits", "train=0.5,validation=0.5")
    _job(photos, out, *splits)
    shutil.rmtree(photos / "china")
    _add_class(photos, tmp_path / "more", "flower", num_images=4)
    result = _job(photos, out, "--overwrite", *splits)
    info = manifest(out)
    assert info["label_names"] == ["astronaut", "china", "coffee", "flower"]
    assert info["num_classes"] == 4 and info["retired_labels"] == ["china"]
    line = (
        "label ids: 'flower' is new with id 3; 'china' (id 1) is retired: no input has it, "
        "and no other label will take its id"
    )
    assert line in _said(result), _said(result)[-3000:]
    assert info["change"]["label_ids"] == line
    assert not [w for w in info["warnings"] if "china" in w], info["warnings"]
    for split in ("train", "validation"):
        assert info["splits"][split]["class_counts"]["china"] == 0
        counts = tfr.class_counts(str(out), split)
        assert counts[1] == 0 and counts[3] == 2, counts
        read = collections.Counter(
            int(label) for _, labels in tfr.make_dataset(str(out), split, 4) for label in labels.numpy()
        )
        assert read == {i: n for i, n in counts.items() if n}, (read, counts)
    _read_right(out)
    inspected = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.inspect", str(out), "--out", str(tmp_path / "report")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert inspected.returncode == 0, inspected.stderr[-3000:]
    assert "retired classes (their ids kept, no example in this version): china (1)" in inspected.stdout
    assert "EMPTY" not in inspected.stdout, inspected.stdout
    # Back again: 'china' takes its own id, and is no longer retired.
    _add_class(photos, tmp_path / "again", "china", num_images=2)
    back = _job(photos, out, "--overwrite", *splits)
    info = manifest(out)
    assert info["label_names"] == ["astronaut", "china", "coffee", "flower"] and "retired_labels" not in info
    assert "label ids: 'china' (id 1) is back" in _said(back), _said(back)[-3000:]


@pytest.mark.slow
def test_relabel_sorted_renumbers_says_each_change_and_a_rollback_across_it_says_so_too(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=6, seed=2, classes=["china", "coffee"])
    out = tmp_path / "out"
    _job(photos, out)
    _add_class(photos, tmp_path / "more", "astronaut")
    _job(photos, out, "--append")
    renumbered = _job(photos, out, "--overwrite", "--relabel", "sorted")
    info = manifest(out)
    assert info["label_names"] == ["astronaut", "china", "coffee"]
    line = "label ids renumbered by --relabel sorted: 'astronaut' 2 -> 0, 'china' 0 -> 1, 'coffee' 1 -> 2"
    assert line in _said(renumbered), _said(renumbered)[-3000:]
    assert info["change"]["label_ids"] == line
    _read_right(out)
    said = _rollback(out, 2)
    assert "label ids differ" in said and "'astronaut' 0 -> 2, 'china' 1 -> 0, 'coffee' 2 -> 1" in said, said
    assert manifest(out)["label_names"] == ["china", "coffee", "astronaut"]
    assert manifest(out)["change"]["label_ids"] in said
    # The rolled-back ids are the ones that go on: an overwrite now keeps version 2's ids.
    _job(photos, out, "--overwrite")
    assert manifest(out)["label_names"] == ["china", "coffee", "astronaut"]

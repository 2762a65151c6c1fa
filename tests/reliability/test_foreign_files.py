"""Files the job did not write, in its output folder, and datasets that are silently wrong.

A folder can hold files named like shards that no run of this job wrote (a user's own export, a
copy from elsewhere): the job writes only in its own run folders, so they are never in its way,
and no flag deletes or replaces them. Content duplicates under two labels are
a wrong dataset, and the console must say so.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli
from tests.dataset_files import tree_files

pytestmark = pytest.mark.slow

SMALL = ["--image_size", "32", "--num_shards", "2"]
PRECIOUS = b"precious"


@pytest.fixture()
def photos(tmp_path) -> pathlib.Path:
    root = tmp_path / "photos"
    make_photo_tree(root, num_images=8, seed=3)
    return root


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]


def _refused(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, result.stderr[-3000:]
    [error] = _error_lines(result)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return error


def _users_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / "own"
    out.mkdir()
    for name in ("train-00005-of-00009.tfrecord", "validation-00000-of-00001.tfrecord"):
        (out / name).write_bytes(PRECIOUS)
    return out


@pytest.mark.parametrize("flags", [[], ["--resume"], ["--overwrite"], ["--overwrite", "--resume"]])
def test_a_folder_of_the_users_shard_named_files_gets_a_dataset_beside_them_untouched(photos, tmp_path, flags):
    # A run writes only into its own folder under shards/ and commits dataset_info.json: a file of
    # the user's, whatever its name, is never in the way, never listed, never touched.
    out = _users_folder(tmp_path)
    before = tree_files(out)
    run_cli("--input", photos, "--output_dir", out, *SMALL, *flags)
    after = {name: data for name, data in tree_files(out).items() if name in before}
    assert after == before
    info = json.loads((out / "dataset_info.json").read_text())
    listed = [shard["file"] for split in info["splits"].values() for shard in split["shards"]]
    assert all(name.startswith("shards/") for name in listed), listed


def test_the_dataset_beside_the_users_shard_named_files_reads_and_verifies(photos, tmp_path):
    # The reader and verify look for stray shards only where the writer puts shards (the run
    # folders): the user's files beside dataset_info.json do not make the dataset unreadable.
    out = _users_folder(tmp_path)
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    verified = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(out)], capture_output=True, text=True, timeout=300
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfdata_readers as t\n"
            "print(sum(int(labels.shape[0]) for _, labels in t.make_dataset(sys.argv[1], 'train', 4)))",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    assert (
        int(read.stdout.split()[-1])
        == json.loads((out / "dataset_info.json").read_text())["splits"]["train"]["num_examples"]
    )
    assert all((out / name).read_bytes() == PRECIOUS for name in ("train-00005-of-00009.tfrecord",))


def test_overwrite_never_deletes_or_replaces_a_shard_named_file_no_manifest_lists(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    # Beside the job's dataset: files named like shards of its splits, and one of another split.
    for name in ("train-00000-of-00001.tfrecord", "train-00005-of-00009.tfrecord", "backup-00000-of-00001.tfrecord"):
        (out / name).write_bytes(PRECIOUS)
    run_cli("--input", photos, "--output_dir", out, "--overwrite", "--image_size", "32", "--num_shards", "1")
    run_cli("--input", photos, "--output_dir", out, "--overwrite", "--image_size", "32", "--num_shards", "3")
    for name in ("train-00000-of-00001.tfrecord", "train-00005-of-00009.tfrecord", "backup-00000-of-00001.tfrecord"):
        assert (out / name).read_bytes() == PRECIOUS, name
    assert json.loads((out / "dataset_info.json").read_text())["version"] == 3


def test_content_duplicates_under_two_labels_are_a_warning(photos, tmp_path):
    (photos / "inside_link").symlink_to(photos / "chelsea", target_is_directory=True)
    out = tmp_path / "out"
    result = run_cli("--input", photos, "--output_dir", out, *SMALL)
    info = json.loads((out / "dataset_info.json").read_text())
    conflicting = [g for g in info["content_duplicates"] if g["conflicting_labels"]]
    assert conflicting, info["content_duplicates"]
    [warning] = [w for w in info["warnings"] if "labels" in w]
    assert f"{len(conflicting)} " in warning and conflicting[0]["files"][0] in warning, warning
    lines = result.stdout.splitlines()
    assert f"WARNING: {warning}" in lines, result.stdout
    # Under the final table, where the other warnings of the run are.
    assert lines.index(f"WARNING: {warning}") > next(i for i, line in enumerate(lines) if line.startswith("total"))


def test_resume_with_other_settings_says_it_does_not_keep_the_earlier_shards_and_why(photos, tmp_path):
    out = tmp_path / "out"
    (photos / "chelsea" / "broken.jpg").write_bytes(b"<html>not found</html>")
    refused = run_cli("--input", photos, "--output_dir", out, "--max_bad_fraction", "0", *SMALL, check=False)
    assert refused.returncode == 1, refused.stderr[-3000:]
    [folder] = (out / "shards").iterdir()
    sidecars = [p for p in folder.iterdir() if p.name.startswith(".train-") and p.name.endswith(".json")]
    assert len(sidecars) == 2, sorted(p.name for p in folder.iterdir())
    assert not (out / "dataset_info.json").exists()
    result = run_cli(
        "--input",
        photos,
        "--output_dir",
        out,
        "--resume",
        "--image_size",
        "40",
        "--num_shards",
        "2",
        "--max_bad_fraction",
        "0.5",
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING") and "not kept" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert "1 earlier run" in warnings[0] and "image_size" in warnings[0], warnings[0]


def test_a_refusal_with_one_staged_shard_says_it_in_the_singular(photos, tmp_path):
    (photos / "chelsea" / "broken.jpg").write_bytes(b"<html>not found</html>")
    result = run_cli(
        "--input",
        photos,
        "--output_dir",
        tmp_path / "out",
        "--max_bad_fraction",
        "0",
        "--image_size",
        "32",
        "--num_shards",
        "1",
        check=False,
    )
    error = _refused(result, 1)
    assert "the 1 shard converted so far stays in " in error and "no version lists it" in error, error


def test_resume_over_a_complete_dataset_warns_before_making_a_new_version(photos, tmp_path):
    # A run killed just after its commit leaves a complete dataset and no run to continue: the
    # user asked to finish a run, and gets a new version instead, so the console says so.
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    result = run_cli("--input", photos, "--output_dir", out, *SMALL, "--resume")
    warnings = [line for line in result.stderr.splitlines() if "holds no interrupted run" in line]
    assert len(warnings) == 1 and "version 1 is complete" in warnings[0], result.stderr[-3000:]
    assert json.loads((out / "dataset_info.json").read_text())["version"] == 2
    # An interrupted run to continue, or no dataset yet: nothing to warn about.
    fresh = run_cli("--input", photos, "--output_dir", tmp_path / "fresh", *SMALL, "--resume")
    assert "holds no interrupted run" not in fresh.stderr

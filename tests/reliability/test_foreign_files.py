"""Files the job did not write, in its output folder, and datasets that are silently wrong.

A folder can hold files named like shards that no run of this job wrote (a user's own export, a
copy from elsewhere): no flag may delete or replace them. Content duplicates under two labels are
a wrong dataset, and the console must say so.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

SMALL = ["--image_size", "32", "--num_shards", "2"]
PRECIOUS = b"precious"


@pytest.fixture()
def photos(tmp_path) -> pathlib.Path:
    root = tmp_path / "photos"
    make_photo_tree(root, num_images=8, seed=3)
    return root


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


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


def test_no_flag_refuses_a_folder_of_the_users_shard_named_files_without_suggesting_resume(photos, tmp_path):
    out = _users_folder(tmp_path)
    before = _files(out)
    error = _refused(run_cli("--input", photos, "--output_dir", out, *SMALL, check=False), 2)
    assert "train-00005-of-00009.tfrecord" in error and "validation-00000-of-00001.tfrecord" in error, error
    assert "--resume" not in error and "--overwrite" not in error, error
    assert _files(out) == before


@pytest.mark.parametrize("flags", [["--resume"], ["--overwrite"], ["--overwrite", "--resume"]])
def test_resume_or_overwrite_with_no_earlier_run_refuses_and_touches_nothing(photos, tmp_path, flags):
    out = _users_folder(tmp_path)
    before = _files(out)
    error = _refused(run_cli("--input", photos, "--output_dir", out, *SMALL, *flags, check=False), 2)
    assert "train-00005-of-00009.tfrecord" in error and "validation-00000-of-00001.tfrecord" in error, error
    assert "no earlier run" in error, error
    assert _files(out) == before


def test_overwrite_never_deletes_or_replaces_a_shard_named_file_no_manifest_lists(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    # Beside the job's dataset: a file this run would write over, one it would delete as a stale
    # shard of its split, and one of a split it does not write.
    for name in ("train-00000-of-00001.tfrecord", "train-00005-of-00009.tfrecord", "backup-00000-of-00001.tfrecord"):
        (out / name).write_bytes(PRECIOUS)
    before = {name: data for name, data in _files(out).items()}
    result = run_cli("--input", photos, "--output_dir", out, "--overwrite", "--image_size", "32",
                     "--num_shards", "1", check=False)
    error = _refused(result, 1)
    assert "train-00000-of-00001.tfrecord" in error and "train-00005-of-00009.tfrecord" in error, error
    assert "backup-00000-of-00001.tfrecord" not in error, error
    visible = {name: data for name, data in _files(out).items() if not name.startswith(".")}
    assert visible == before, "a file changed"


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


def test_resume_with_other_settings_says_how_many_staged_shards_it_does_not_keep_and_why(photos, tmp_path):
    out = tmp_path / "out"
    (photos / "chelsea" / "broken.jpg").write_bytes(b"<html>not found</html>")
    refused = run_cli("--input", photos, "--output_dir", out, "--max_bad_fraction", "0", *SMALL, check=False)
    assert refused.returncode == 1, refused.stderr[-3000:]
    staged = [p for p in out.iterdir() if p.name.startswith(".staged-train-") and p.name.endswith(".json")]
    assert len(staged) == 2, sorted(p.name for p in out.iterdir())
    result = run_cli("--input", photos, "--output_dir", out, "--resume", "--image_size", "40", "--num_shards", "2",
                     "--max_bad_fraction", "0.5")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING") and "staged" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert "2 staged shards" in warnings[0] and "image_size" in warnings[0], warnings[0]


def test_a_refusal_with_one_staged_shard_says_it_in_the_singular(photos, tmp_path):
    (photos / "chelsea" / "broken.jpg").write_bytes(b"<html>not found</html>")
    result = run_cli("--input", photos, "--output_dir", tmp_path / "out", "--max_bad_fraction", "0",
                     "--image_size", "32", "--num_shards", "1", check=False)
    error = _refused(result, 1)
    assert "the 1 shard converted so far stays staged" in error, error

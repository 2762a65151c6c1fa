"""What `python -m tfdata_readers.verify` prints: its own lines only, however TensorFlow is set up."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

_REPO = pathlib.Path(__file__).resolve().parents[2]


def _verify(*args: str) -> subprocess.CompletedProcess:
    # The user's environment, as a terminal gives it: no TF_CPP_MIN_LOG_LEVEL set beforehand.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP_", "ABSL_"))}
    env["PYTHONPATH"] = str(_REPO)
    return subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )


def test_a_clean_dataset_prints_one_line_and_nothing_else(jpeg_dir: pathlib.Path) -> None:
    result = _verify(str(jpeg_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "version 1 of 1: checked 5 shard(s) of split(s) train, validation: 0 problem(s)"
    ]
    assert result.stderr == "", result.stderr


def test_problems_are_still_printed_and_only_they(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(jpeg_dir, copy)
    (copy / "validation-00000-of-00001.tfrecord").unlink()
    result = _verify(str(copy), "--split", "validation")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"MISMATCH {copy}/validation-00000-of-00001.tfrecord: missing"]
    assert result.stdout.splitlines() == ["version 1 of 1: checked 1 shard(s) of split(s) validation: 1 problem(s)"]


def test_an_error_is_one_line_on_stderr(tmp_path: pathlib.Path) -> None:
    result = _verify(str(tmp_path / "nothing-here"))
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR ") and "nothing-here" in lines[0], result.stderr


def test_only_this_packages_command_lines_are_quietened() -> None:
    from tfdata_readers._quiet_start import invoked_as_command

    assert invoked_as_command(["python", "-m", "tfdata_readers.verify", "d"], "-m")
    assert invoked_as_command(["python", "-X", "utf8", "-m", "tfdata_readers.inspect"], "-m")
    assert invoked_as_command(["/venv/bin/python", "/venv/bin/verify-tfrecords", "d"], "/venv/bin/verify-tfrecords")
    assert not invoked_as_command(["python", "train.py"], "train.py")  # a training script sees TensorFlow as is
    assert not invoked_as_command(["python", "-m", "pytest"], "-m")

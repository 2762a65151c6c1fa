"""Nothing half-written under a final name: a job killed mid-run leaves no final shard name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError
from beam_jobs.imaging.reading import read_source
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO


def test_oversized_files_are_refused_before_and_while_reading(tmp_path):
    path = tmp_path / "big.jpg"
    path.write_bytes(b"\xff\xd8" + b"\x00" * 5000)
    # The refusal names the flag the limit came from, as --max_pixels's does.
    with pytest.raises(BadInputError, match=r"over --max_file_mb=0\.5 \(524288 bytes\)") as listed:
        read_source(InputFile("big.jpg", str(path), size=600_000), max_file_bytes=1 << 19)
    with pytest.raises(BadInputError, match=r"over --max_file_mb=0\.000953674") as unlisted:
        read_source(InputFile("big.jpg", str(path)), max_file_bytes=1000)
    assert listed.value.reason == unlisted.value.reason == "file_too_large"
    assert len(read_source(InputFile("big.jpg", str(path)), max_file_bytes=ImageConfig().max_file_bytes)) == 5002


@pytest.mark.slow
def test_killed_job_leaves_no_file_under_a_final_name(tmp_path):
    """A killed run leaves no manifest, and every file under a final shard name in its run folder
    is complete: shards are written under temporary names and renamed only once whole."""
    src = tmp_path / "src"
    make_photo_tree(src, num_images=400, seed=5)
    out = tmp_path / "out"
    log = (tmp_path / "stderr.txt").open("w")  # closed after the kill below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(src),
            "--output_dir",
            str(out),
            "--image_size",
            "96",
            "--num_shards",
            "8",
            "--direct_num_workers",
            "2",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    runs = out / "shards"
    try:
        # Kill once some shards are complete and others are still being written.
        while time.monotonic() < deadline:
            names = [p.name for p in runs.glob("*/*")] if runs.exists() else []
            if any(n.endswith(".tfrecord") and not n.startswith(".") for n in names) and any(
                n.startswith(".tmp-") for n in names
            ):
                break
            if process.poll() is not None:  # said, so that a run that ended first is not a mystery
                stderr = (tmp_path / "stderr.txt").read_text(encoding="utf-8", errors="replace")[-3000:]
                pytest.fail(f"the job ended (exit {process.returncode}) before it was caught mid-run:\n{stderr}")
            time.sleep(0.02)
        else:
            pytest.fail("the job never had a finished and an unfinished shard at once")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()
    assert not (out / "dataset_info.json").exists()  # nothing committed, so no reader sees any of it
    [folder] = list(runs.iterdir())
    complete = [p for p in folder.iterdir() if p.name.endswith(".tfrecord") and not p.name.startswith(".")]
    assert complete
    for path in complete:
        # A shard under its final name is complete: 400 photos in 8 shards is 50 records, every CRC checks out.
        assert sum(1 for _ in tf.data.TFRecordDataset(str(path))) == 50

"""Tests of the start-up shard check, corrupt-record handling and verify() with its CLI."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import tfdata_readers

_REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def copy_dir(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(jpeg_dir, tmp_path / "data"))


def _corrupt_middle(path: pathlib.Path) -> None:
    """Flips one byte in the middle of the file: same size, broken CRC of one record."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _count(ds: tf.data.Dataset) -> int:
    return sum(int(image.shape[0]) for image, _ in ds)


def test_missing_shard_fails_at_start_naming_it(copy_dir: pathlib.Path) -> None:
    (copy_dir / "train-00002-of-00004.tfrecord").unlink()
    with pytest.raises(tfdata_readers.ShardError, match=r"train-00002-of-00004\.tfrecord.*does not exist"):
        tfdata_readers.make_dataset(copy_dir, "train", 8)


def test_wrong_size_fails_at_start_naming_it(copy_dir: pathlib.Path) -> None:
    with open(copy_dir / "train-00001-of-00004.tfrecord", "ab") as f:
        f.write(b"junk")
    with pytest.raises(tfdata_readers.ShardError, match=r"train-00001-of-00004\.tfrecord has \d+ bytes"):
        tfdata_readers.make_dataset(copy_dir, "train", 8)


@pytest.mark.parametrize("training", [False, True])
def test_corrupt_record_fails_naming_the_shard(copy_dir: pathlib.Path, training: bool) -> None:
    _corrupt_middle(copy_dir / "train-00003-of-00004.tfrecord")
    ds = tfdata_readers.make_dataset(copy_dir, "train", 8, training=training, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"corrupt or truncated shard.*train-00003-of-00004"):
        _count(ds)


def test_skip_corrupt_counts_and_reports_the_loss(copy_dir: pathlib.Path, capfd) -> None:
    shard = copy_dir / "train-00003-of-00004.tfrecord"
    _corrupt_middle(shard)
    readable = 0
    try:
        for _ in tf.data.TFRecordDataset(str(shard)):
            readable += 1
    except tf.errors.DataLossError:
        pass
    tfdata_readers.reset_skipped_records()
    ds = tfdata_readers.make_dataset(copy_dir, "train", 8, skip_corrupt=True)
    seen = _count(ds)
    lost = 12 - readable  # this shard holds 12 of the 50 examples
    assert 0 < lost < 12
    assert seen == 50 - lost
    assert tfdata_readers.skipped_records() == {str(shard): lost}
    assert f"skipped {lost} corrupt" in capfd.readouterr().err


def test_verify_passes_clean_data(jpeg_dir: pathlib.Path) -> None:
    assert tfdata_readers.verify(jpeg_dir) == []


def test_verify_reports_each_mismatch(copy_dir: pathlib.Path) -> None:
    _corrupt_middle(copy_dir / "train-00000-of-00004.tfrecord")
    manifest = json.loads((copy_dir / "dataset_info.json").read_text())
    manifest["splits"]["validation"]["shards"][0]["num_examples"] = 14
    manifest["splits"]["validation"]["num_examples"] = 14
    (copy_dir / "dataset_info.json").write_text(json.dumps(manifest))
    (copy_dir / "train-00002-of-00004.tfrecord").unlink()
    problems = [str(p) for p in tfdata_readers.verify(copy_dir)]
    text = "\n".join(problems)
    assert "train-00000-of-00004.tfrecord: sha256" in text
    assert "train-00000-of-00004.tfrecord: unreadable from record " in text
    assert "train-00002-of-00004.tfrecord: missing" in text
    assert "validation-00000-of-00001.tfrecord: 13 records, manifest says 14" in text
    assert tfdata_readers.verify(copy_dir, ["train"]) != [] and len(tfdata_readers.verify(copy_dir, ["train"])) == 3


def test_verify_cli_exit_codes(jpeg_dir: pathlib.Path, copy_dir: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(_REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    ok = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(jpeg_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
    )
    assert ok.returncode == 0, ok.stderr
    assert "checked 5 shard(s)" in ok.stdout and "0 problem(s)" in ok.stdout
    _corrupt_middle(copy_dir / "validation-00000-of-00001.tfrecord")
    bad = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(copy_dir), "--split", "validation"],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
    )
    assert bad.returncode == 1
    assert "MISMATCH" in bad.stderr and "validation-00000-of-00001.tfrecord" in bad.stderr


def test_training_on_a_split_smaller_than_one_batch_is_refused(jpeg_dir) -> None:
    """drop_remainder would leave no batch: with num_epochs=None, Keras would wait on an empty repeat."""
    with pytest.raises(ValueError, match=r"split 'validation' .* has 13 examples: fewer than one batch of 14"):
        tfdata_readers.make_dataset(jpeg_dir, "validation", 14, training=True, seed=0, num_epochs=None)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match=r"fewer than one global batch of 14"):
        tfdata_readers.make_dataset(jpeg_dir, "validation", 7, training=True, seed=0, input_context=context)
    # Evaluation keeps the partial batch: allowed.
    assert sum(int(i.shape[0]) for i, _ in tfdata_readers.make_dataset(jpeg_dir, "validation", 14)) == 13

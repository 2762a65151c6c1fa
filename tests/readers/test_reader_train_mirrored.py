"""End to end: real photos -> conversion CLI -> shards -> launch/train_mirrored.py on 2 replicas."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import IN_PROCESS

_REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_mirrored_two_replicas_on_real_photos(tmp_path: pathlib.Path) -> None:
    from beam_jobs.sample_data import make_photo_tree  # writes the photo tree only, no pipeline

    make_photo_tree(tmp_path / "photos", num_images=72, size=(500, 375), seed=3)
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": ""}
    convert = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(tmp_path / "photos"),
            "--output_dir",
            str(tmp_path / "shards"),
            "--image_size",
            "64",
            "--encoding",
            "jpeg",
            "--num_shards",
            "4",
            *IN_PROCESS,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert convert.returncode == 0, convert.stderr[-4000:]
    for input_dtype in ("float32", "uint8"):
        history_json = tmp_path / f"history_{input_dtype}.json"
        train = subprocess.run(
            [
                sys.executable,
                str(_REPO / "launch" / "train_mirrored.py"),
                "--data_dir",
                str(tmp_path / "shards"),
                "--num_replicas",
                "2",
                "--global_batch_size",
                "16",
                "--epochs",
                "2",
                "--input_dtype",
                input_dtype,
                "--history_json",
                str(history_json),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=_REPO,
            timeout=600,
        )
        assert train.returncode == 0, train.stderr[-4000:]
        history = json.loads(history_json.read_text())
        assert history["num_replicas"] == [2]
        assert history["steps_per_epoch"] == [72 // 16]  # from the manifest
        assert len(history["loss"]) == 2 and all(0 < v < 100 for v in history["loss"])
        assert "training on 2 replica(s)" in train.stdout and input_dtype in train.stdout


def test_train_mirrored_refuses_a_split_smaller_than_a_global_batch_even_with_steps_per_epoch(
    tmp_path: pathlib.Path,
) -> None:
    """Training drops the last partial batch, so 10 examples at a global batch of 16 give no batch
    at all: asking for 2 steps must fail naming the cause, not with a bare StopIteration."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import reader_fixtures

    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (10, 2)}, image_size=(16, 16))
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for extra in (["--steps_per_epoch", "2"], []):
        train = subprocess.run(
            [
                sys.executable,
                str(_REPO / "launch" / "train_mirrored.py"),
                "--data_dir",
                str(data_dir),
                "--num_replicas",
                "2",
                "--global_batch_size",
                "16",
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=_REPO,
            timeout=300,
        )
        assert train.returncode == 2, train.stderr[-3000:]
        assert "train_mirrored.py: error: split 'train' has 10 examples: fewer than one global batch of 16" in (
            train.stderr
        ), train.stderr[-3000:]
        assert "StopIteration" not in train.stderr and "Traceback" not in train.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "test"], r"split 'test' is not in \S*dataset_info\.json; expected one of \['train'\]"),
        (["--global_batch_size", "5"], r"global_batch_size 5 is not divisible by the 2 replicas in sync"),
        (["--seed", "-1"], r"seed must be None or an int with 0 <= seed < 2\*\*63 \(got -1\)"),
        (["--data_dir", "/nonexistent/out"], r"no manifest at /nonexistent/out/dataset_info\.json"),
    ],
    ids=["unknown-split", "indivisible-batch", "negative-seed", "missing-data-dir"],
)
def test_train_mirrored_start_up_refusals_are_one_error_line_and_exit_2(
    tmp_path: pathlib.Path, args: list[str], message: str
) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import reader_fixtures

    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (10, 2)}, image_size=(16, 16))
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(data_dir),
            "--num_replicas",
            "2",
            "--global_batch_size",
            "4",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=300,
    )
    assert train.returncode == 2, train.stderr[-3000:]
    errors = [line for line in train.stderr.splitlines() if line.startswith("train_mirrored.py: error: ")]
    assert len(errors) == 1 and re.search(message, errors[0]), train.stderr[-3000:]
    assert "Traceback" not in train.stderr


def test_train_mirrored_validates_every_epoch_and_saves_a_loadable_model(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import numpy as np
    import reader_fixtures
    import tensorflow as tf

    data_dir = reader_fixtures.write_dataset(
        tmp_path / "data", splits={"train": (32, 2), "validation": (11, 1)}, image_size=(16, 16)
    )
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    save_path = tmp_path / "out" / "model.keras"
    history_json = tmp_path / "history.json"
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(data_dir),
            "--num_replicas",
            "2",
            "--global_batch_size",
            "8",
            "--epochs",
            "2",
            "--save_path",
            str(save_path),
            "--history_json",
            str(history_json),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    history = json.loads(history_json.read_text())
    assert len(history["val_loss"]) == 2 and all(np.isfinite(history["val_loss"]))
    assert "validating on 2 steps" in train.stdout  # 11 examples, global batch 8: 2 steps, the last partial
    assert "ran out of data" not in train.stdout + train.stderr
    model = tf.keras.models.load_model(save_path)
    images = np.zeros((3, 16, 16, 3), np.float32)
    assert model.predict(images, verbose=0).shape == (3, len(reader_fixtures.LABEL_NAMES))


def test_train_mirrored_refuses_a_save_path_keras_cannot_write(tmp_path: pathlib.Path) -> None:
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(tmp_path),
            "--save_path",
            str(tmp_path / "model.h5"),
        ],
        capture_output=True,
        text=True,
        cwd=_REPO,
        timeout=300,
    )
    assert train.returncode == 2
    assert "--save_path must end in .keras" in train.stderr


@pytest.mark.slow
def test_train_mirrored_skips_an_empty_validation_split_with_a_notice(tmp_path: pathlib.Path) -> None:
    """The job writes a validation split with no examples when every one of its rows is a dead
    letter (it warns); training must go on without validating, and say why in one line."""
    from beam_jobs.sample_data import make_photo_tree

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from photos import write_broken_files

    good = make_photo_tree(tmp_path / "photos", num_images=24, size=(200, 150), seed=5)
    broken = write_broken_files(tmp_path / "broken")
    rows = ["uri,label,split"]
    rows += [f"{path},{path.parent.name},train" for path in good]
    rows += [f"{path},{good[0].parent.name},validation" for path in broken]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    convert = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--manifest",
            str(tmp_path / "list.csv"),
            "--output_dir",
            str(tmp_path / "shards"),
            "--image_size",
            "32",
            "--num_shards",
            "2",
            "--max_bad_fraction",
            "1",
            *IN_PROCESS,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert convert.returncode == 0, convert.stderr[-4000:]
    info = json.loads((tmp_path / "shards" / "dataset_info.json").read_text())
    assert info["splits"]["validation"]["num_examples"] == 0, info["splits"]
    history_json = tmp_path / "history.json"
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(tmp_path / "shards"),
            "--num_replicas",
            "2",
            "--global_batch_size",
            "8",
            "--history_json",
            str(history_json),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    assert "Traceback" not in train.stderr, train.stderr[-4000:]
    assert "validation split has no examples: not validating" in train.stdout + train.stderr
    assert "validating on" not in train.stdout
    history = json.loads(history_json.read_text())
    assert len(history["loss"]) == 1 and "val_loss" not in history


@pytest.mark.parametrize(
    "num_validation, notice, steps",
    [
        (1, "validation split has 1 example(s), fewer than the 2 replicas: not validating", None),
        (9, None, 2),
    ],  # 9 at a global batch of 8 would leave a last batch of 1: one replica's part empty
    ids=["fewer-than-replicas", "last-batch-smaller-than-replicas"],
)
def test_train_mirrored_leaves_no_replica_an_empty_validation_batch(
    tmp_path: pathlib.Path, num_validation: int, notice: str | None, steps: int | None
) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import reader_fixtures

    data_dir = reader_fixtures.write_dataset(
        tmp_path / "data", splits={"train": (16, 2), "validation": (num_validation, 1)}, image_size=(16, 16)
    )
    env = {**os.environ, "PYTHONPATH": str(_REPO), "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    history_json = tmp_path / "history.json"
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(data_dir),
            "--num_replicas",
            "2",
            "--global_batch_size",
            "8",
            "--history_json",
            str(history_json),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    history = json.loads(history_json.read_text())
    if notice:
        assert notice in train.stderr and "validating on" not in train.stdout and "val_loss" not in history
    else:
        assert f"validating on {steps} steps" in train.stdout and len(history["val_loss"]) == 1


@pytest.mark.parametrize(
    "num_examples, global_batch, replicas, expected",
    [
        (0, 8, 2, None),
        (1, 8, 2, None),
        (1, 8, 1, 8),
        (11, 8, 2, 8),
        (9, 8, 2, 6),
        (3, 2, 2, 4),
        (5, 8, 4, 8),
        (16, 8, 2, 8),
    ],
)
def test_validation_batch_size_leaves_no_replica_an_empty_batch(
    num_examples: int, global_batch: int, replicas: int, expected: int | None
) -> None:
    sys.path.insert(0, str(_REPO / "launch"))
    from train_mirrored import validation_batch_size

    batch = validation_batch_size(num_examples, global_batch, replicas)
    assert batch == expected
    if batch is not None:
        assert batch % replicas == 0 and (num_examples % batch == 0 or num_examples % batch >= replicas)

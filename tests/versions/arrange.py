"""Arranging dataset versions from one real conversion: the job's output (the flat layout of a
release before versioning: version 1) plus run folders under shards/ holding copies of its shards,
each committed with commit_version as a later version.

Files go through ``put(relative_path, bytes)``, so the same arrangement is built on local disk,
MinIO or fake-gcs-server.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable

import tensorflow as tf

from tests.conftest import IN_PROCESS
from tests.dataset_files import as_older_release
from tests.photos import make_test_tree

__all__ = ["RUN_A", "RUN_B", "RUN_KILLED", "convert_photos", "dataset_files", "local_put", "record_keys", "run_content"]

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN_A, RUN_B, RUN_KILLED = "20261201T133000Z-3fa2c1d0", "20261202T090000Z-0b1c2d3e", "20261203T101500Z-deadbeef"

Put = Callable[[str, bytes], None]


def convert_photos(root: pathlib.Path) -> pathlib.Path:
    """One real conversion of 18 real photos (and the broken files) into root/out, in two splits
    of two shards each: ``python -m beam_jobs`` in a fresh process, the venv first on PATH."""
    make_test_tree(root / "tree", num_images=18)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(root / "tree"),
            "--output_dir",
            str(root / "out"),
            "--image_size",
            "32",
            "--num_shards",
            "2",
            "--max_bad_fraction",
            "0.5",
            "--splits",
            "train=0.75,validation=0.25",
            *IN_PROCESS,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"the job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}"
    # The tests below arrange their versions from a dataset in the flat layout of older releases.
    return as_older_release(root / "out")


def dataset_files(job_output: pathlib.Path) -> list[pathlib.Path]:
    """The job's output files (shards, dataset_info.json, dead letters)."""
    return sorted(p for p in job_output.iterdir() if p.is_file())


def local_put(root: pathlib.Path) -> Put:
    def put(relative: str, data: bytes) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return put


def _records(data: bytes) -> list[tf.train.Example]:
    """The records of a shard's bytes, read by TensorFlow itself (from a temp copy: the bytes may
    come from an object store TensorFlow cannot reach)."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "shard.tfrecord"
        path.write_bytes(data)
        return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


def record_keys(data: bytes) -> list[str]:
    """The image/key/sha256 of every record of a shard's bytes, in order."""
    return [e.features.feature["image/key/sha256"].bytes_list.value[0].decode() for e in _records(data)]


def _labels(data: bytes) -> list[str]:
    return [e.features.feature["image/class/text"].bytes_list.value[0].decode() for e in _records(data)]


def run_content(job_output: pathlib.Path, run: str, put: Put, *, shards_per_split: int | None = None) -> dict:
    """Copies the job's shards (the first ``shards_per_split`` of each split, or all) into
    shards/<run>/, each with a sidecar, plus the run's dead letters; returns the manifest content
    listing them (counts and class counts recomputed for a subset)."""
    info = json.loads((job_output / "dataset_info.json").read_text())
    content = copy.deepcopy(info)
    for facts in content["splits"].values():
        shards = facts["shards"][:shards_per_split]
        counts = {name: 0 for name in facts["class_counts"]}
        for shard in shards:
            name = shard["file"]
            data = (job_output / name).read_bytes()
            put(f"shards/{run}/{name}", data)
            put(f"shards/{run}/.{name}.json", json.dumps({"file": name, "sha256": shard["sha256"]}).encode())
            shard["file"] = f"shards/{run}/{name}"
            for label in _labels(data):
                counts[label] += 1
        facts.update(
            shards=shards,
            num_shards=len(shards),
            num_examples=sum(s["num_examples"] for s in shards),
            class_counts=counts,
        )
    put(f"shards/{run}/dead_letters.jsonl", (job_output / "dead_letters.jsonl").read_bytes())
    content["dead_letters_file"] = f"shards/{run}/dead_letters.jsonl"
    return content

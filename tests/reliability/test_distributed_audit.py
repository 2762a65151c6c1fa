"""Distributed correctness: an exactly-once audit by key over epochs, seeds and replica counts, and
proof it can fail."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

_READERS = pathlib.Path(__file__).resolve().parents[1] / "readers"
if str(_READERS) not in sys.path:
    sys.path.insert(0, str(_READERS))

import reader_fixtures  # noqa: E402

import tfdata_readers  # noqa: E402
from tfdata_readers.audit import audit_epoch, audit_epochs, epoch_keys  # noqa: E402

_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
REPLICA_COUNTS = (1, 2, 3, 8)
SEEDS = (4, 1234)


# The audit itself, on hand-made key lists: it must be able to fail.


def test_audit_epoch_finds_duplicates_missing_and_unknown_keys() -> None:
    split = ["a", "b", "c", "d"]
    assert audit_epoch(["d", "c", "b", "a"], split).ok
    audit = audit_epoch(["a", "a", "b", "x"], split)
    assert audit.duplicates == {"a": 2} and audit.missing == ("c", "d") and audit.unknown == ("x",)
    assert len(audit.problems) == 3
    assert not audit_epoch(["a", "b", "c"], split).ok
    assert audit_epoch(["a", "b", "c"], split, max_missing=1).ok
    # A key the split holds twice (two identical source files) must be delivered twice.
    assert audit_epoch(["a", "a"], ["a", "a"]).ok and not audit_epoch(["a"], ["a", "a"]).ok


def test_audit_epochs_rules_for_eval_and_training() -> None:
    split = [str(i) for i in range(10)]
    shuffled = ["3", "1", "4", "0", "5", "9", "2", "6", "8", "7"]
    assert audit_epochs([split, split], split, training=False, global_batch_size=4) == []
    assert audit_epochs([split, shuffled[:7]], split, training=False, global_batch_size=4) == [
        "epoch 2: 3 of 10 examples missing (at most 0 allowed), e.g. '6'"
    ]
    assert audit_epochs([split[:7], shuffled[:8]], split, training=True, global_batch_size=4) == []
    assert audit_epochs([split[:6], shuffled], split, training=True, global_batch_size=4)[0].startswith(
        "epoch 1: 4 of 10 examples missing (at most 3 allowed)"
    )
    assert audit_epochs([split, split], split, training=True, global_batch_size=4) == [
        "epoch 2: same order as epoch 1 (not reshuffled)"
    ]


# The reader under MirroredStrategy: 1, 2, 3 and 8 replicas x 2 seeds x 2 epochs, in a subprocess.


@pytest.fixture(scope="module")
def mirrored_audit(tmp_path_factory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("audit")
    # 23 examples: not a multiple of any global batch (2, 4, 6, 16); 5 shard files.
    data_dir = reader_fixtures.write_dataset(root / "data", splits={"train": (23, 5)}, image_size=(16, 16), seed=5)
    out = root / "audit.json"
    proc = subprocess.run(
        [sys.executable, str(_READERS / "audit_check.py"), str(out), str(data_dir)],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
@pytest.mark.parametrize("run", ["eval", *(f"seed={s} train" for s in SEEDS), "seeds"])
def test_mirrored_audit_exactly_once(mirrored_audit: dict[str, list[str]], replicas: int, run: str) -> None:
    name = f"replicas={replicas} {run}"
    assert name in mirrored_audit, sorted(mirrored_audit)
    assert mirrored_audit[name] == [], f"{name}: {mirrored_audit[name]}"


# Two input pipelines in-process: the reader passes the audit, a broken dataset_fn must not.


@pytest.fixture(scope="module")
def sixteen_shards(tmp_path_factory) -> pathlib.Path:
    # 16 files, 2 examples each: 2 pipelines take 8 whole files each.
    root = tmp_path_factory.mktemp("audit16")
    return reader_fixtures.write_dataset(root / "data", splits={"train": (32, 16)}, image_size=(8, 8), seed=16)


def _contexts(pipelines: int) -> list[tf.distribute.InputContext]:
    return [
        tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i, num_replicas_in_sync=pipelines)
        for i in range(pipelines)
    ]


def _shuffle_files_then_shard(
    files: list[str], context: tf.distribute.InputContext, *, seed: int | None
) -> tf.data.Dataset:
    """A dataset_fn that shuffles the file list, then keeps this pipeline's share of it by element.

    With `seed=None` it is BROKEN on purpose: every pipeline draws its own random file order, so
    the shares of the pipelines overlap (duplicates) and leave gaps (missing examples). With the
    same seed on every pipeline the orders agree and the shares partition the files.
    """
    names = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed)
    names = names.shard(context.num_input_pipelines, context.input_pipeline_id)
    records = names.interleave(tf.data.TFRecordDataset, cycle_length=4)
    spec = {"image/key/sha256": tf.io.FixedLenFeature([], tf.string)}
    return records.batch(4).map(lambda r: {"key": tf.io.parse_example(r, spec)["image/key/sha256"]})


def _audit_pipelines(datasets: list[tf.data.Dataset], expected: list[str], epochs: int = 2) -> list[str]:
    """Audits the union of what all pipelines deliver, epoch by epoch."""
    runs = [[key for ds in datasets for key in epoch_keys(ds)] for _ in range(epochs)]
    return audit_epochs(runs, expected, training=False, global_batch_size=1)


def test_audit_catches_unseeded_shuffle_before_sharding(sixteen_shards: pathlib.Path) -> None:
    files = [s.path for s in tfdata_readers.load_manifest(sixteen_shards).split("train").shards]
    expected = reader_fixtures.expected_keys(sixteen_shards, "train")
    broken = [_shuffle_files_then_shard(files, c, seed=None) for c in _contexts(2)]
    problems = _audit_pipelines(broken, expected)
    # The two random orders partition the 16 files by chance with probability 1/C(16, 8) = 1/12870
    # per epoch, so both epochs passing (a false pass of this test) has probability below 1e-8.
    assert problems, "the audit passed a dataset_fn that shuffles without a seed before sharding"
    assert any("duplicate deliveries" in p for p in problems), problems
    assert any("examples missing" in p for p in problems), problems


def test_audit_passes_the_same_dataset_fn_with_a_shared_seed(sixteen_shards: pathlib.Path) -> None:
    files = [s.path for s in tfdata_readers.load_manifest(sixteen_shards).split("train").shards]
    expected = reader_fixtures.expected_keys(sixteen_shards, "train")
    seeded = [_shuffle_files_then_shard(files, c, seed=7) for c in _contexts(2)]
    assert _audit_pipelines(seeded, expected) == []


@pytest.mark.parametrize("training", [False, True])
def test_audit_passes_the_reader_on_two_input_pipelines(sixteen_shards: pathlib.Path, training: bool) -> None:
    expected = reader_fixtures.expected_keys(sixteen_shards, "train")
    datasets = [
        tfdata_readers.make_dataset(
            sixteen_shards,
            "train",
            4,
            input_context=c,
            training=training,
            seed=3,
            with_metadata=True,
            drop_remainder=False,
        )
        for c in _contexts(2)
    ]
    assert _audit_pipelines(datasets, expected) == []

"""One dataset object over many passes: paths fixed at construction, evaluation order, cardinality, resuming."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import reader_fixtures
import tensorflow as tf

import tfdata_readers as tfr

TRAIN, VALIDATION = 50, 13  # the `datasets` fixture's split sizes


def _keys(dataset: tf.data.Dataset) -> list[str]:
    return [k.decode() for _, _, meta in dataset for k in meta["key"].numpy()]


# Paths are resolved once, when the dataset is built.


def test_relative_data_dir_is_resolved_at_construction(tmp_path: pathlib.Path, monkeypatch) -> None:
    # Two folders holding shards of the same names with different pixels.
    for name, seed in (("a", 1), ("b", 2)):
        reader_fixtures.write_dataset(
            tmp_path / name / "data", splits={"train": (6, 2)}, image_size=(16, 16), seed=seed
        )
    monkeypatch.chdir(tmp_path / "a")
    dataset = tfr.make_dataset("data", "train", 6, with_metadata=True)
    before = next(iter(dataset))
    monkeypatch.chdir(tmp_path / "b")
    after = next(iter(dataset))
    assert [k.decode() for k in before[2]["key"].numpy()] == [k.decode() for k in after[2]["key"].numpy()]
    np.testing.assert_array_equal(before[0].numpy(), after[0].numpy())
    expected = sorted(reader_fixtures.expected_keys(tmp_path / "a" / "data", "train"))
    assert sorted(k.decode() for k in after[2]["key"].numpy()) == expected


def test_manifest_paths_are_absolute_for_a_relative_data_dir(tmp_path: pathlib.Path, monkeypatch) -> None:
    reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (4, 2)}, image_size=(16, 16))
    monkeypatch.chdir(tmp_path)
    info = tfr.load_manifest("data")
    assert info.data_dir == str(tmp_path / "data")
    assert all(os.path.isabs(s.path) for s in info.split("train").shards)


# Evaluation has no randomness: the same order on every pass and every iterator.


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_evaluation_order_is_the_same_every_pass(datasets, encoding: str) -> None:
    dataset = tfr.make_dataset(datasets[encoding], "train", 4, with_metadata=True, num_parallel_calls=4)
    first = _keys(dataset)
    assert sorted(first) == sorted(reader_fixtures.expected_keys(datasets[encoding], "train"))
    assert _keys(dataset) == first
    other = tfr.make_dataset(datasets[encoding], "train", 4, with_metadata=True, num_parallel_calls=4)
    assert _keys(other) == first
    # Two iterators at once, interleaved.
    a, b = iter(dataset), iter(dataset)
    for x, y in zip(a, b, strict=True):
        assert x[2]["key"].numpy().tolist() == y[2]["key"].numpy().tolist()


def test_evaluation_labels_pair_with_predictions_from_another_pass(jpeg_dir) -> None:
    """y_true from one pass and images from another give the same rows."""
    dataset = tfr.make_dataset(jpeg_dir, "train", 4)
    labels = np.concatenate([y.numpy() for _, y in dataset])
    images = np.concatenate([x.numpy() for x, _ in dataset])
    again = np.concatenate([x.numpy() for x, _ in dataset])
    np.testing.assert_array_equal(images, again)
    assert labels.shape == (TRAIN,)


def test_deterministic_false_stays_an_explicit_choice() -> None:
    assert tfr.ReadConfig().resolved_deterministic(None, training=False) is True
    assert tfr.ReadConfig(deterministic=False).resolved_deterministic(None, training=False) is False
    assert tfr.ReadConfig().resolved_deterministic(None, training=True) is False
    assert tfr.ReadConfig().resolved_deterministic(3, training=True) is True


# Cardinality: the true number of batches, known before reading.


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("drop_remainder", [None, False, True])
@pytest.mark.parametrize("num_epochs", [1, 3, None])
@pytest.mark.parametrize("batch_size", [4, 13])
def test_cardinality_is_the_true_batch_count(
    jpeg_dir, training: bool, drop_remainder: bool | None, num_epochs: int | None, batch_size: int
) -> None:
    dataset = tfr.make_dataset(
        jpeg_dir, "train", batch_size, training=training, seed=1, drop_remainder=drop_remainder, num_epochs=num_epochs
    )
    drop = training if drop_remainder is None else drop_remainder
    per_epoch = TRAIN // batch_size if drop else math.ceil(TRAIN / batch_size)
    if num_epochs is None:
        assert dataset.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
        counted = sum(1 for _ in dataset.take(per_epoch * 2 + 1))
        assert counted == per_epoch * 2 + 1
        return
    assert dataset.cardinality().numpy() == per_epoch * num_epochs
    assert sum(1 for _ in dataset) == per_epoch * num_epochs


def test_cardinality_of_a_validation_split(jpeg_dir) -> None:
    dataset = tfr.make_dataset(jpeg_dir, "validation", 4)
    assert dataset.cardinality().numpy() == math.ceil(VALIDATION / 4) == sum(1 for _ in dataset)


@pytest.mark.parametrize("training", [False, True])
def test_keras_fit_shows_the_step_total_and_does_not_run_out(jpeg_dir, training: bool, capsys) -> None:
    """Keras warns (warnings.warn) when a dataset of unknown size ends, and shows "Unknown" steps."""
    dataset = tfr.make_dataset(jpeg_dir, "train", 8, training=training, seed=0, image_size=16, num_epochs=1)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16, 16, 3)),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(len(reader_fixtures.LABEL_NAMES)),
        ]
    )
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=2, verbose=1, shuffle=False)
    out = capsys.readouterr()
    steps = TRAIN // 8 if training else math.ceil(TRAIN / 8)
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert "ran out of data" not in out.out + out.err
    assert "Unknown" not in out.out
    assert f"{steps}/{steps}" in out.out


# Resuming at an epoch: epoch k of a run started at initial_epoch=k is epoch k of an uninterrupted run.


def _epochs(dataset: tf.data.Dataset, passes: int) -> list[tuple[list[str], np.ndarray]]:
    """(keys, pixels) of each of `passes` passes: one iteration each."""
    out = []
    for _ in range(passes):
        keys, pixels = [], []
        for image, _, meta in dataset:
            keys += [k.decode() for k in meta["key"].numpy()]
            pixels.append(image.numpy())
        out.append((keys, np.concatenate(pixels)))
    return out


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_initial_epoch_replays_exactly_the_epochs_of_an_uninterrupted_run(datasets, encoding: str) -> None:
    options = dict(training=True, seed=5, with_metadata=True, shuffle_buffer_size=16)
    full = _epochs(tfr.make_dataset(datasets[encoding], "train", 4, **options), 4)
    resumed = _epochs(tfr.make_dataset(datasets[encoding], "train", 4, initial_epoch=2, **options), 2)
    assert full[2][0] != full[3][0] != full[1][0]  # the epochs do differ
    for (keys, pixels), (full_keys, full_pixels) in zip(resumed, full[2:], strict=True):
        assert keys == full_keys
        np.testing.assert_array_equal(pixels, full_pixels)


def test_initial_epoch_with_one_endless_iterator(jpeg_dir) -> None:
    options = dict(training=True, seed=5, with_metadata=True, num_epochs=None)
    steps = TRAIN // 4
    full = list(tfr.make_dataset(jpeg_dir, "train", 4, **options).take(4 * steps))
    resumed = list(tfr.make_dataset(jpeg_dir, "train", 4, initial_epoch=2, **options).take(2 * steps))
    for (image, _, meta), (full_image, _, full_meta) in zip(resumed, full[2 * steps :], strict=True):
        assert meta["key"].numpy().tolist() == full_meta["key"].numpy().tolist()
        np.testing.assert_array_equal(image.numpy(), full_image.numpy())


def _dataset_ops(dataset: tf.data.Dataset) -> set[str]:
    """Every op of the dataset's graph and of the functions it calls."""
    from tensorflow.core.framework import graph_pb2

    policy = tf.data.experimental.ExternalStatePolicy.WARN  # the reader's error notes are Python
    graph = graph_pb2.GraphDef.FromString(dataset._as_serialized_graph(external_state_policy=policy).numpy())
    return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.parametrize("num_epochs", [1, 3])
def test_training_passes_are_counted_without_a_python_generator(jpeg_dir, num_epochs: int) -> None:
    # tf.data's prefetch thread would call a generator under the GIL; a process dropping its
    # iterator (after an error, or at exit) held the GIL while waiting for that thread: a deadlock.
    dataset = tfr.make_dataset(jpeg_dir, "train", 4, training=True, seed=5, num_epochs=num_epochs, with_metadata=True)
    assert "GeneratorDataset" not in _dataset_ops(dataset)
    # Each new iteration of the same dataset is still the next num_epochs epochs.
    steps = TRAIN // 4  # batches of an epoch (training drops the remainder)
    first, second = _keys(dataset.take(steps)), _keys(dataset.take(steps))
    assert len(set(first)) == len(set(second)) == steps * 4
    assert first != second


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_initial_epoch_is_validated(jpeg_dir, bad) -> None:
    with pytest.raises(ValueError, match=f"initial_epoch.*{bad!r}"):
        tfr.make_dataset(jpeg_dir, "train", 4, training=True, initial_epoch=bad)


@pytest.mark.parametrize("training", [False, True])
def test_cache_serves_later_passes_without_the_shards(tmp_path: pathlib.Path, training: bool) -> None:
    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (12, 3)}, image_size=(16, 16))
    dataset = tfr.make_dataset(data_dir, "train", 4, training=training, seed=0, cache=True, with_metadata=True)
    first = _keys(dataset)
    for shard in data_dir.glob("*.tfrecord"):
        shard.unlink()
    second = _keys(dataset)  # the next epoch: read from memory
    assert sorted(second) == sorted(first)
    if training:
        assert second != first  # the record shuffle still changes every epoch


# A seed orders the epochs by itself: TensorFlow's global seed, which Dataset.shuffle mixes into
# its own, has no say (a resumed trainer that seeds differently still gets the same epochs).


def test_a_seeded_order_does_not_depend_on_the_global_seed(datasets) -> None:
    orders = {}
    child = pathlib.Path(__file__).with_name("global_seed_check.py")
    for global_seed in ("none", "0", "1", "42"):
        proc = subprocess.run(
            [sys.executable, str(child), str(datasets["jpeg"]), global_seed],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"global seed {global_seed}: {proc.stderr[-3000:]}"
        orders[global_seed] = json.loads(proc.stdout.strip().splitlines()[-1])
    # The crops and flips, like the order, come from the reader's seed alone.
    assert len({result["pixels"] for result in orders.values()}) == 1, orders
    orders = {seed: result["keys"] for seed, result in orders.items()}
    first, second = orders["none"][:TRAIN], orders["none"][TRAIN:]
    assert sorted(first) == sorted(second) == sorted(reader_fixtures.expected_keys(datasets["jpeg"], "train"))
    assert first != second  # the two epochs are shuffled differently
    assert all(order == orders["none"] for order in orders.values()), orders

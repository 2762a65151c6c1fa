"""Per-example class weights from the reader: (image, label, weight) batches, checked and looked up in-graph."""

from __future__ import annotations

import numpy as np
import pytest
import reader_fixtures

import tfdata_readers as tfr


@pytest.mark.parametrize("training", [False, True])
def test_class_weights_add_a_weight_per_example(jpeg_dir, training: bool) -> None:
    weights = {0: 3.0, 2: 0.25}
    dataset = tfr.make_dataset(
        jpeg_dir, "train", 8, training=training, seed=1, class_weights=weights, with_metadata=True
    )
    seen = 0
    for _image, label, weight, meta in dataset:
        assert weight.dtype.name == "float32" and weight.shape == label.shape
        expected = [weights.get(int(y), 1.0) for y in label.numpy()]
        np.testing.assert_array_equal(weight.numpy(), expected)
        assert meta["label_text"].shape == label.shape
        seen += int(label.shape[0])
    assert seen == (48 if training else 50)


def test_class_weights_train_a_keras_model(jpeg_dir) -> None:
    import tensorflow as tf

    balanced = {i: 1.0 / (i + 1) for i in range(len(reader_fixtures.LABEL_NAMES))}
    dataset = tfr.make_dataset(jpeg_dir, "train", 8, training=True, seed=0, image_size=16, class_weights=balanced)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16, 16, 3)),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(len(reader_fixtures.LABEL_NAMES)),
        ]
    )
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])


def test_config_stores_class_weights_as_sorted_pairs() -> None:
    config = tfr.ReadConfig(class_weights={3: 1, 0: 0.5})
    assert config.class_weights == ((0, 0.5), (3, 1.0))
    hash(config)  # still hashable, as a frozen config should be


@pytest.mark.parametrize(
    "bad,match",
    [
        ({-1: 1.0}, "label id -1"),
        ({True: 1.0}, "label id True"),
        ({"cat": 1.0}, "label id 'cat'"),
        ({0: float("nan")}, "weight nan of label 0"),
        ({0: -2.0}, "weight -2.0 of label 0"),
        ({}, "at least one"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_class_weights_are_named(bad, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tfr.ReadConfig(class_weights=bad)


def test_class_weight_for_an_unknown_label_names_the_manifest(jpeg_dir) -> None:
    n = len(reader_fixtures.LABEL_NAMES)
    with pytest.raises(ValueError, match=rf"label id {n}.*dataset_info.json.*{n} classes"):
        tfr.make_dataset(jpeg_dir, "train", 8, class_weights={n: 2.0})

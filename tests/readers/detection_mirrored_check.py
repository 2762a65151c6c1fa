"""Run in a subprocess: a small Keras detection head trained under MirroredStrategy on 2 logical CPUs.

Usage: python detection_mirrored_check.py OUT.json DATA_DIR
Writes the losses per epoch, and the keys each evaluation pass saw (exactly once each).
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

REPLICAS = 2
GLOBAL_BATCH = 4
SIZE = 64


def main(out: str, data_dir: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import keras

    import tfdata_readers as tfr

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    info = tfr.load_manifest(data_dir)
    options = dict(image_size=SIZE, max_boxes=4)

    def first_box(images, targets):  # the head regresses each image's first box and its classes
        return images, {"box": targets["boxes"][:, 0], "labels": targets["labels"]}

    dataset = tfr.make_dataset(data_dir, "train", GLOBAL_BATCH, training=True, seed=1, num_epochs=None, **options)
    dataset = dataset.map(first_box)
    with strategy.scope():
        inputs = keras.Input((SIZE, SIZE, 3))
        x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
        x = keras.layers.Conv2D(16, 3, strides=2, activation="relu")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(
            inputs,
            {
                "box": keras.layers.Dense(4, activation="sigmoid", name="box")(x),
                "labels": keras.layers.Dense(info.num_classes, activation="sigmoid", name="labels")(x),
            },
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss={"box": "mse", "labels": "binary_crossentropy"})
    steps = max(1, info.split("train").num_examples // GLOBAL_BATCH)
    history = model.fit(strategy.experimental_distribute_dataset(dataset), epochs=6, steps_per_epoch=steps, verbose=0)
    keys = []
    evaluation = tfr.distribute(strategy, data_dir, "train", GLOBAL_BATCH, with_metadata=True, **options)
    for _, targets, meta in evaluation:
        for replica in strategy.experimental_local_results(meta["key"]):
            keys += [k.decode() for k in replica.numpy()]
        for replica in strategy.experimental_local_results(targets["classes"]):
            assert replica.shape[1:] == (4,)
    pathlib.Path(out).write_text(json.dumps({"loss": history.history["loss"], "eval_keys": keys}))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""A trainer, in its own process: Keras `fit` under MirroredStrategy (two logical CPUs), one epoch
at a time, on datasets built once at start-up, plus an evaluation pass after each epoch that
records every example it read. Between epochs it waits for the test, which changes the dataset
(--overwrite, --append, rollback) meanwhile.

Usage: python -m tests.lifecycle.trainer_child OUT.json DATA_DIR EPOCHS
Prints "epoch K" after each epoch and waits for a line on stdin; writes OUT.json at the end:
{"seen": [[[filename, label name], ...] per epoch], "steps": [...], "version": N, "losses": [...]}.
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

REPLICAS = 2
GLOBAL_BATCH = 4


def main(out: str, data_dir: str, epochs: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel  # after the devices are set

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    info = tfr.load_manifest(data_dir)  # the version this trainer opened, resolved once
    train = tfr.distribute(
        strategy, data_dir, "train", GLOBAL_BATCH, training=True, seed=0, image_size=16, num_epochs=None
    )
    evaluation = tfr.distribute(strategy, data_dir, "train", GLOBAL_BATCH, image_size=16, with_metadata=True)
    steps = int(train.cardinality) if int(train.cardinality) > 0 else None
    per_epoch = info.split("train").num_examples // GLOBAL_BATCH
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((16, 16, 3)),
                tf.keras.layers.Conv2D(4, 3, activation="relu"),
                tf.keras.layers.GlobalAveragePooling2D(),
                tf.keras.layers.Dense(info.num_classes),
            ]
        )
        model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen, losses = [], []
    for epoch in range(epochs):
        history = model.fit(train, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=steps or per_epoch, verbose=0)
        losses.append(float(history.history["loss"][-1]))
        names = []
        for _, labels, metadata in evaluation:
            for local_labels, local_names in zip(
                strategy.experimental_local_results(labels),
                strategy.experimental_local_results(metadata["filename"]),
                strict=True,
            ):
                names += [
                    [name.decode(), info.label_names[int(label)]]
                    for name, label in zip(local_names.numpy(), local_labels.numpy(), strict=True)
                ]
        seen.append(sorted(names))
        print(f"epoch {epoch}", flush=True)
        sys.stdin.readline()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"seen": seen, "losses": losses, "version": info.raw.get("version")}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

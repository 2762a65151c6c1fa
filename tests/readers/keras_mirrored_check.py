"""Run in a subprocess: Keras 3 `fit` on `distribute` datasets under MirroredStrategy over 2 logical CPUs.

Usage: python keras_mirrored_check.py OUT.json DATA_DIR
Logical devices must be configured before TensorFlow initialises, hence a separate process.
Writes {check name: what was seen} to OUT.json: step counts, Keras's console output and warnings,
per-example weights, and the error `fit(class_weight=...)` gives.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import sys
import warnings

import numpy as np
import tensorflow as tf

REPLICAS = 2
GLOBAL_BATCH = 8
CLASS_WEIGHTS = {0: 2.0, 3: 0.5, 6: 0.0}


def main(out: str, data_dir: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import tfdata_readers as tfr

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    results: dict[str, object] = {}
    info = tfr.load_manifest(data_dir)

    def steps(dataset) -> int:
        return sum(1 for _ in dataset)

    for name, options in {
        "train": dict(training=True, seed=0),
        "eval": dict(training=False),
        "train 3 epochs": dict(training=True, seed=0, num_epochs=3),
        "eval 2 epochs": dict(training=False, num_epochs=2),
        "train endless": dict(training=True, seed=0, num_epochs=None),
    }.items():
        dataset = tfr.distribute(strategy, data_dir, "train", GLOBAL_BATCH, image_size=16, **options)
        cardinality = int(dataset.cardinality)
        results[f"{name} cardinality"] = cardinality
        results[f"{name} steps"] = cardinality if cardinality < 0 else steps(dataset)

    # Resuming at epoch 2: the same steps, by key and by pixels, as epochs 2 and 3 of a run from 0.
    def run_keys(initial_epoch: int, steps: int) -> list[tuple[list[str], float]]:
        dataset = tfr.distribute(
            strategy,
            data_dir,
            "train",
            GLOBAL_BATCH,
            training=True,
            seed=3,
            image_size=16,
            num_epochs=None,
            with_metadata=True,
            initial_epoch=initial_epoch,
        )
        out = []
        for step, (image, _, meta) in enumerate(dataset):
            if step == steps:
                break
            keys = [k.decode() for local in strategy.experimental_local_results(meta["key"]) for k in local.numpy()]
            pixels = float(sum(tf.reduce_sum(local).numpy() for local in strategy.experimental_local_results(image)))
            out.append((keys, pixels))
        return out

    per_epoch = 50 // GLOBAL_BATCH
    results["resumed"] = run_keys(2, 2 * per_epoch)
    results["uninterrupted"] = run_keys(0, 4 * per_epoch)[2 * per_epoch :]

    # Per-example weights, looked up from each example's label.
    weighted = tfr.distribute(
        strategy,
        data_dir,
        "train",
        GLOBAL_BATCH,
        training=True,
        seed=0,
        image_size=16,
        class_weights=CLASS_WEIGHTS,
        with_metadata=True,
    )
    pairs = []
    for _, label, weight, _ in weighted:
        for local_label, local_weight in zip(
            strategy.experimental_local_results(label), strategy.experimental_local_results(weight), strict=True
        ):
            pairs += list(zip(local_label.numpy().tolist(), local_weight.numpy().tolist(), strict=True))
    results["weights"] = pairs

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((16, 16, 3)),
                tf.keras.layers.GlobalAveragePooling2D(),
                tf.keras.layers.Dense(info.num_classes),
            ]
        )
        model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=[])
    train = tfr.distribute(
        strategy, data_dir, "train", GLOBAL_BATCH, training=True, seed=0, image_size=16, class_weights=CLASS_WEIGHTS
    )
    validation = tfr.distribute(strategy, data_dir, "validation", GLOBAL_BATCH, image_size=16)
    console = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(console):
        warnings.simplefilter("always")
        history = model.fit(train, validation_data=validation, epochs=2, verbose=1, shuffle=False)
    results["fit output"] = console.getvalue()
    results["fit warnings"] = [str(w.message) for w in caught]
    results["fit losses"] = [float(v) for v in history.history["loss"]]
    results["fit val_losses"] = [float(v) for v in history.history["val_loss"]]

    plain = tfr.distribute(strategy, data_dir, "train", GLOBAL_BATCH, training=True, seed=0, image_size=16)
    try:
        model.fit(plain, epochs=1, verbose=0, class_weight=CLASS_WEIGHTS)
        results["class_weight error"] = ""
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        results["class_weight error"] = f"{type(e).__name__}: {e}"
    results["finite"] = bool(np.all(np.isfinite(results["fit losses"])))
    pathlib.Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Run in a subprocess: exactly-once checks of `distribute` under MirroredStrategy on 1-8 logical CPUs.

Usage: python distribute_check.py OUT.json DATA_DIR [DATA_DIR ...]
Logical devices must be configured before TensorFlow initialises, hence a separate process.
Writes {config name: problem or ""} to OUT.json.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

REPLICA_COUNTS = (1, 2, 3, 8)
PER_REPLICA_BATCH = 2
REPEAT_EPOCHS = 4


def main(out: str, data_dirs: list[str]) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(REPLICA_COUNTS))
    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[2]), str(pathlib.Path(__file__).resolve().parent)]
    import reader_fixtures

    import tfdata_readers

    results: dict[str, str] = {}
    for replicas in REPLICA_COUNTS:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        global_batch = PER_REPLICA_BATCH * replicas
        for data_dir in data_dirs:
            expected = sorted(reader_fixtures.expected_keys(data_dir, "train"))
            shards = len(tfdata_readers.load_manifest(data_dir).split("train").shards)

            def epoch(dataset, strategy=strategy) -> tuple[list[str], str]:
                keys, problem = [], ""
                for image, _, meta in dataset:
                    for local_image, local_keys in zip(
                        strategy.experimental_local_results(image),
                        strategy.experimental_local_results(meta["key"]),
                        strict=True,
                    ):
                        if local_image.shape[0] > PER_REPLICA_BATCH:
                            problem = f"per-replica batch of {local_image.shape[0]} > {PER_REPLICA_BATCH}"
                        keys += [k.decode() for k in local_keys.numpy()]
                return keys, problem

            name = f"replicas={replicas} shards={shards} examples={len(expected)}"
            keys, problem = epoch(
                tfdata_readers.distribute(strategy, data_dir, "train", global_batch, with_metadata=True)
            )
            if not problem and sorted(keys) != expected:
                problem = f"eval saw {len(keys)} keys ({len(set(keys))} distinct) of {len(expected)}"
            results[f"{name} eval"] = problem

            train = tfdata_readers.distribute(
                strategy, data_dir, "train", global_batch, with_metadata=True, training=True, seed=4
            )
            epochs = []
            for number in (1, 2):
                keys, problem = epoch(train)
                if not problem and len(keys) != len(set(keys)):
                    problem = f"epoch {number} has duplicates"
                if not problem and not set(keys) <= set(expected):
                    problem = f"epoch {number} has unknown keys"
                if not problem and len(expected) - len(keys) > global_batch - 1:
                    problem = f"epoch {number} dropped {len(expected) - len(keys)} > global batch - 1"
                epochs.append(keys)
                results[f"{name} train epoch {number}"] = problem
            if epochs[0] == epochs[1]:
                results[f"{name} train epoch 2"] = "epoch 2 has the same order as epoch 1"

            # The README's recipe: num_epochs=None and Keras' steps_per_epoch. Every global step
            # must be made of one pass (no key twice in it), every epoch of steps must hold each
            # key at most once, and every per-replica batch must be full.
            steps = tfdata_readers.steps_per_epoch(data_dir, "train", global_batch)
            repeated = iter(
                tfdata_readers.distribute(
                    strategy,
                    data_dir,
                    "train",
                    global_batch,
                    with_metadata=True,
                    training=True,
                    seed=4,
                    num_epochs=None,
                )
            )
            problem = ""
            for number in range(1, REPEAT_EPOCHS + 1):
                epoch_keys: list[str] = []
                for step in range(steps):
                    _, _, meta = next(repeated)
                    local = [[k.decode() for k in t.numpy()] for t in strategy.experimental_local_results(meta["key"])]
                    step_keys = [k for keys in local for k in keys]
                    if not problem and any(len(keys) != PER_REPLICA_BATCH for keys in local):
                        problem = f"epoch {number} step {step}: per-replica batches of {[len(k) for k in local]}"
                    if not problem and len(step_keys) != len(set(step_keys)):
                        problem = f"epoch {number} step {step}: a global batch holds the same key twice"
                    epoch_keys += step_keys
                if not problem and len(epoch_keys) != len(set(epoch_keys)):
                    problem = f"epoch {number} of {steps} steps holds the same key twice"
            results[f"{name} train repeat"] = problem
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

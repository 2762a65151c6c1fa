"""Run in a subprocess: the exactly-once audit of `distribute` under MirroredStrategy on 1, 2, 3 and 8 logical CPUs.

Usage: python audit_check.py OUT.json DATA_DIR
For each replica count: evaluation over EPOCHS epochs, and training over EPOCHS epochs for each
seed of SEEDS. Logical devices must be configured before TensorFlow initialises, hence a separate
process. Writes {"replicas=R eval" | "replicas=R seed=S train" | "replicas=R seeds": [problem, ...]}.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

REPLICA_COUNTS = (1, 2, 3, 8)
SEEDS = (4, 1234)
EPOCHS = 2
PER_REPLICA_BATCH = 2


def main(out: str, data_dir: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(REPLICA_COUNTS))
    here = pathlib.Path(__file__).resolve()
    sys.path[:0] = [str(here.parents[2]), str(here.parent)]
    import reader_fixtures

    import tfdata_readers
    from tfdata_readers.audit import audit_epochs, epoch_keys

    expected = reader_fixtures.expected_keys(data_dir, "train")  # read straight from the shards
    results: dict[str, list[str]] = {}
    for replicas in REPLICA_COUNTS:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        global_batch = PER_REPLICA_BATCH * replicas

        def run(strategy=strategy, global_batch=global_batch, **options) -> list[list[str]]:
            dataset = tfdata_readers.distribute(
                strategy, data_dir, "train", global_batch, with_metadata=True, **options
            )
            return [epoch_keys(dataset, strategy=strategy) for _ in range(EPOCHS)]

        results[f"replicas={replicas} eval"] = audit_epochs(
            run(), expected, training=False, global_batch_size=global_batch
        )
        first_epochs = []
        for seed in SEEDS:
            epochs = run(training=True, seed=seed)
            results[f"replicas={replicas} seed={seed} train"] = audit_epochs(
                epochs, expected, training=True, global_batch_size=global_batch
            )
            first_epochs.append(epochs[0])
        results[f"replicas={replicas} seeds"] = (
            [f"seeds {SEEDS} gave the same first epoch"] if first_epochs[0] == first_epochs[1] else []
        )
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Run in a subprocess: the exactly-once audit through a tf.data service, under MirroredStrategy on 2 logical CPUs.

Usage: python data_service_check.py OUT.json DATA_DIR ADDRESS
Evaluation over EPOCHS epochs with static sharding (the default) and with dynamic sharding, and a
training stream (dynamic, num_epochs=None) over TRAIN_PASSES passes' worth of global steps.
Logical devices must be configured before TensorFlow initialises, hence a separate process.
Writes {"eval static" | "eval dynamic" | "train": [problem, ...]}.
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys

import tensorflow as tf

REPLICAS = 2
PER_REPLICA_BATCH = 2
EPOCHS = 2
# Dynamic sharding hands splits to whichever worker asks first, so which examples a pass's worth of
# steps holds depends on timing; over enough of them every example must come round. 5 once left
# one key unseen while other tests loaded the 2 cores; 8 makes that far less likely, and a key that
# never comes round (the defect this guards against) fails at any number.
TRAIN_PASSES = 8


def main(out: str, data_dir: str, address: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    here = pathlib.Path(__file__).resolve()
    sys.path[:0] = [str(here.parents[2]), str(here.parent)]
    import reader_fixtures

    import tfdata_readers
    from tfdata_readers.audit import audit_epochs, epoch_keys

    expected = reader_fixtures.expected_keys(data_dir, "train")  # read straight from the shards
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    global_batch = PER_REPLICA_BATCH * REPLICAS
    results: dict[str, list[str]] = {}
    for sharding in ("static", "dynamic"):
        dataset = tfdata_readers.distribute(
            strategy,
            data_dir,
            "train",
            global_batch,
            with_metadata=True,
            data_service=address,
            data_service_sharding=sharding,
        )
        epochs = [epoch_keys(dataset, strategy=strategy) for _ in range(EPOCHS)]
        results[f"eval {sharding}"] = audit_epochs(epochs, expected, training=False, global_batch_size=global_batch)

    # Training streams without end; each global step must be whole (a full batch on every replica)
    # and hold known keys, and over several passes' worth of steps every example must come round.
    steps = TRAIN_PASSES * tfdata_readers.steps_per_epoch(data_dir, "train", global_batch)
    stream = iter(
        tfdata_readers.distribute(
            strategy,
            data_dir,
            "train",
            global_batch,
            with_metadata=True,
            training=True,
            seed=3,
            num_epochs=None,
            data_service=address,
        )
    )
    problems, seen = [], collections.Counter()
    for step in range(steps):
        _, _, meta = next(stream)
        local = [[k.decode() for k in t.numpy()] for t in strategy.experimental_local_results(meta["key"])]
        if any(len(keys) != PER_REPLICA_BATCH for keys in local) and not problems:
            problems.append(f"step {step}: per-replica batches of {[len(k) for k in local]}")
        seen.update(k for keys in local for k in keys)
    unknown = set(seen) - set(expected)
    if unknown:
        problems.append(f"{len(unknown)} unknown key(s)")
    if set(expected) - set(seen):
        problems.append(f"{len(set(expected) - set(seen))} key(s) never seen in {TRAIN_PASSES} passes' worth of steps")
    results["train"] = problems
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])

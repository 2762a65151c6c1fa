"""Run in a subprocess: the keys of each global step of a training stream through a tf.data
service, under MirroredStrategy on 2 logical CPUs.

Usage: python data_service_steps_check.py OUT.json DATA_DIR ADDRESS STEPS PER_REPLICA_BATCH
Writes {"steps": [[[key, ...] per replica] per step]}. Logical devices must be configured before
TensorFlow initialises, hence a separate process.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

REPLICAS = 2


def main(out: str, data_dir: str, address: str, steps: str, per_replica_batch: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[2])]
    import tfdata_readers

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    stream = iter(
        tfdata_readers.distribute(
            strategy,
            data_dir,
            "train",
            int(per_replica_batch) * REPLICAS,
            with_metadata=True,
            training=True,
            seed=3,
            num_epochs=None,
            data_service=address,
        )
    )
    found = []
    for _ in range(int(steps)):
        _, _, meta = next(stream)
        found.append([[k.decode() for k in t.numpy()] for t in strategy.experimental_local_results(meta["key"])])
    pathlib.Path(out).write_text(json.dumps({"steps": found}))


if __name__ == "__main__":
    main(*sys.argv[1:6])

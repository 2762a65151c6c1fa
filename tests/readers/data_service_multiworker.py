"""Run in a subprocess as one trainer of a 2-worker MultiWorkerMirroredStrategy (TF_CONFIG set by the
test), reading through a tf.data service.

Usage: python data_service_multiworker.py OUT.json DATA_DIR ADDRESS
Writes the keys this trainer's replica saw in two evaluation epochs, and in the first steps of a
training stream: {"eval1": [...], "eval2": [...], "train": [...], "num_replicas_in_sync": n}.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

TRAIN_STEPS = 4


def main(out: str, data_dir: str, address: str) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import tfdata_readers
    from tfdata_readers.audit import epoch_keys

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = 4 * strategy.num_replicas_in_sync
    evaluation = tfdata_readers.distribute(
        strategy, data_dir, "train", global_batch, with_metadata=True, data_service=address
    )
    seen = {"eval1": epoch_keys(evaluation, strategy=strategy), "eval2": epoch_keys(evaluation, strategy=strategy)}
    stream = iter(
        tfdata_readers.distribute(
            strategy,
            data_dir,
            "train",
            global_batch,
            with_metadata=True,
            training=True,
            seed=2,
            num_epochs=None,
            data_service=address,
        )
    )
    seen["train"] = []
    for _ in range(TRAIN_STEPS):
        _, _, meta = next(stream)
        for local in strategy.experimental_local_results(meta["key"]):
            seen["train"] += [k.decode() for k in local.numpy()]
    seen["num_replicas_in_sync"] = strategy.num_replicas_in_sync
    pathlib.Path(out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:4])

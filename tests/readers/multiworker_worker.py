"""Run in a subprocess as one worker of a 2-worker MultiWorkerMirroredStrategy (TF_CONFIG set by the test).

Usage: python multiworker_worker.py OUT.json DATA_DIR
Writes the keys this worker's replica saw: {"eval": [...], "train1": [...], "train2": [...]}.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf


def main(out: str, data_dir: str) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import tfdata_readers

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = 4 * strategy.num_replicas_in_sync

    def keys_of(dataset) -> list[str]:
        keys = []
        for _, _, meta in dataset:
            for local in strategy.experimental_local_results(meta["key"]):
                keys += [k.decode() for k in local.numpy()]
        return keys

    seen = {"eval": keys_of(tfdata_readers.distribute(strategy, data_dir, "train", global_batch, with_metadata=True))}
    train = tfdata_readers.distribute(
        strategy, data_dir, "train", global_batch, with_metadata=True, training=True, seed=9, drop_remainder=False
    )
    seen["train1"] = keys_of(train)
    seen["train2"] = keys_of(train)
    # The default for training: drop the remainder. Every worker must deliver the same full steps.
    seen["train_drop"] = keys_of(
        tfdata_readers.distribute(strategy, data_dir, "train", global_batch, with_metadata=True, training=True, seed=9)
    )
    seen["num_replicas_in_sync"] = strategy.num_replicas_in_sync
    pathlib.Path(out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

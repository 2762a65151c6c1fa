"""Child of test_reader_passes: prints the training order of one seeded dataset, as JSON, after
setting TensorFlow's global seed to argv[2] ("none": not set). A child, because the global seed
is process-wide state that no test should leave behind."""

from __future__ import annotations

import json
import sys

import tensorflow as tf

import tfdata_readers as tfr

data_dir, global_seed = sys.argv[1], sys.argv[2]
if global_seed != "none":
    tf.keras.utils.set_random_seed(int(global_seed))
dataset = tfr.make_dataset(
    data_dir, "train", 5, training=True, seed=5, with_metadata=True, config=tfr.ReadConfig(num_epochs=2)
)
print(json.dumps([k.decode() for _, _, meta in dataset for k in meta["key"].numpy()]))

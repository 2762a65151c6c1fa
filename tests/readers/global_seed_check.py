"""Child of test_reader_passes: prints the training order of one seeded dataset and a digest of its
augmented pixels (crops and flips), as JSON, after
setting TensorFlow's global seed to argv[2] ("none": not set). A child, because the global seed
is process-wide state that no test should leave behind."""

from __future__ import annotations

import hashlib
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
keys, pixels = [], hashlib.sha256()
for images, _, meta in dataset:
    keys += [k.decode() for k in meta["key"].numpy()]
    pixels.update(images.numpy().tobytes())
print(json.dumps({"keys": keys, "pixels": pixels.hexdigest()}))

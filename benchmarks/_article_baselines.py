"""The four pipelines of the seed article (shared/reference), as printed, for benchmarks/reader.py.

Each builder returns a dataset of (float32 [32, 224, 224, 3], int32 [32]) batches from the same
source JPEGs. The article leaves `load_and_preprocess` and `get_label` undefined; here they are
Pillow decode + resize to 224x224 + /255, and the class id of the photo's folder.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from PIL import Image

__all__ = [
    "problem_from_generator",
    "method1_interleave_generators",
    "method2_paths_then_map",
    "write_method4_float_tfrecords",
    "method4_float_tfrecords",
]

IMAGE_SIZE = 224
BATCH_SIZE = 32
_SIGNATURE = (
    tf.TensorSpec(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=tf.float32),
    tf.TensorSpec(shape=(), dtype=tf.int32),
)


def load_and_preprocess(path: str) -> np.ndarray:
    """The article's undefined helper: Pillow decode, resize to 224x224, scale to [0, 1]."""
    with Image.open(path) as image:
        image = image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
        return np.asarray(image, np.float32) / 255.0


def problem_from_generator(paths: Sequence[str], labels: Sequence[int]) -> tf.data.Dataset:
    """ "The Problem": all the work in one Python generator (plus the batch + prefetch it mentions)."""

    def data_generator():
        for path, label in zip(paths, labels, strict=True):
            yield load_and_preprocess(path), label

    dataset = tf.data.Dataset.from_generator(data_generator, output_signature=_SIGNATURE)
    return dataset.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def method1_interleave_generators(
    paths: Sequence[str], labels: Sequence[int], *, num_shards: int = 4
) -> tf.data.Dataset:
    """Method 1, fixed: the printed `shard_id.numpy()` fails inside `interleave` (the id is a
    symbolic tensor there), so the shard id reaches the generator via `from_generator(args=...)`,
    as the article intends."""
    paths, labels = list(paths), list(labels)

    def generator(shard_id, shards):
        for i in range(int(shard_id), len(paths), int(shards)):
            yield load_and_preprocess(paths[i]), labels[i]

    dataset = tf.data.Dataset.range(num_shards).interleave(
        lambda shard_id: tf.data.Dataset.from_generator(
            generator, output_signature=_SIGNATURE, args=(shard_id, num_shards)
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
        cycle_length=num_shards,
        deterministic=False,
    )
    return dataset.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def method2_paths_then_map(paths: Sequence[str], labels: Sequence[int]) -> tf.data.Dataset:
    """Method 2 as printed: a generator of paths, then a parallel map of TF decode + resize."""

    def path_generator():
        yield from zip(paths, labels, strict=True)

    path_dataset = tf.data.Dataset.from_generator(
        path_generator,
        output_signature=(tf.TensorSpec(shape=(), dtype=tf.string), tf.TensorSpec(shape=(), dtype=tf.int32)),
    )

    def load_and_preprocess_tf(path, label):
        image = tf.io.read_file(path)
        image = tf.image.decode_jpeg(image, channels=3)
        image = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE])
        image = tf.cast(image, tf.float32) / 255.0
        return image, label

    dataset = path_dataset.map(load_and_preprocess_tf, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def write_method4_float_tfrecords(
    paths: Sequence[str], labels: Sequence[int], out_dir: pathlib.Path, *, num_shards: int = 4
) -> float:
    """Method 4's writer as printed (float_list of 224*224*3 values), into `num_shards` files
    named data_shard_*.tfrecord as its reader expects. Returns images/sec written."""
    import time

    out_dir.mkdir(parents=True, exist_ok=True)
    writers = [tf.io.TFRecordWriter(str(out_dir / f"data_shard_{i}.tfrecord")) for i in range(num_shards)]
    start = time.perf_counter()
    for i, (path, label) in enumerate(zip(paths, labels, strict=True)):
        image = load_and_preprocess(path)
        feature = {
            "image": tf.train.Feature(float_list=tf.train.FloatList(value=image.flatten())),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        writers[i % num_shards].write(example.SerializeToString())
    for writer in writers:
        writer.close()
    return len(paths) / (time.perf_counter() - start)


def method4_float_tfrecords(out_dir: pathlib.Path) -> tf.data.Dataset:
    """Method 4's reader as printed: list_files + interleave + per-example parse of float lists."""
    files = tf.data.Dataset.list_files(str(out_dir / "data_shard_*.tfrecord"))
    dataset = files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE, cycle_length=4)

    def parse_example(serialized):
        features = tf.io.parse_single_example(
            serialized,
            {
                "image": tf.io.FixedLenFeature([IMAGE_SIZE * IMAGE_SIZE * 3], tf.float32),
                "label": tf.io.FixedLenFeature([1], tf.int64),
            },
        )
        image = tf.reshape(features["image"], (IMAGE_SIZE, IMAGE_SIZE, 3))
        label = features["label"][0]
        return image, label

    dataset = dataset.map(parse_example, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)

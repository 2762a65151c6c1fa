"""Reads the serialized records of a shard, failing (or counting the loss) when a shard is corrupt."""

from __future__ import annotations

import collections
import sys
import threading

import numpy as np
import tensorflow as tf

__all__ = ["read_shard", "skipped_records", "reset_skipped_records"]

_skipped: collections.Counter[str] = collections.Counter()
_skipped_lock = threading.Lock()


def skipped_records() -> dict[str, int]:
    """Records lost per shard path so far in this process, when `ReadConfig.skip_corrupt` is on."""
    with _skipped_lock:
        return dict(_skipped)


def reset_skipped_records() -> None:
    """Clears the counts `skipped_records()` returns."""
    with _skipped_lock:
        _skipped.clear()


def _count_skipped(path: bytes, lost: np.int64) -> np.int64:
    with _skipped_lock:
        _skipped[path.decode()] += int(lost)
    return lost


# Records per check: the count check runs once per chunk, not once per record.
_CHECK_CHUNK = 32


def read_shard(
    path: tf.Tensor, expected: tf.Tensor, *, buffer_size: int, skip_corrupt: bool
) -> tf.data.Dataset:
    """Serialized records of one shard, checked against the manifest's count for that shard.

    TensorFlow's own DataLossError does not say which file is corrupt. So the shard is read with
    `ignore_errors()` (which ends the file at the first bad record) in chunks, an empty chunk marks
    the end, and a running count is checked there: a short shard either fails with an error naming
    it or, with `skip_corrupt`, has its loss counted and logged. Chunking keeps the check's cost
    per record small; `unbatch` hands on single records again.
    """
    records = tf.data.TFRecordDataset(path, buffer_size=buffer_size).ignore_errors()
    chunks = records.batch(_CHECK_CHUNK).concatenate(
        tf.data.Dataset.from_tensors(tf.constant([], tf.string))  # end marker: the only empty chunk
    )

    def check(count: tf.Tensor, chunk: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        size = tf.shape(chunk, out_type=tf.int64)[0]
        short = tf.logical_and(tf.equal(size, 0), count < expected)

        def on_short() -> tf.Tensor:
            lost = expected - count
            if skip_corrupt:
                tf.print(
                    "tfdata_readers: WARNING: skipped", lost, "corrupt or unreadable record(s) at the end of shard",
                    path, output_stream=sys.stderr,
                )
                return tf.numpy_function(_count_skipped, [path, lost], tf.int64, stateful=True)
            failed = tf.debugging.Assert(
                False,
                ["corrupt or truncated shard", path, "- read", count, "of", expected, "records the manifest lists"],
                summarize=1,
            )
            with tf.control_dependencies([failed]):
                return tf.identity(lost)

        checked = tf.cond(short, on_short, lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([checked]):
            return count + size, tf.identity(chunk)

    return chunks.scan(tf.constant(0, tf.int64), check).unbatch()

"""Reads a shard's serialized records, named for parse errors; a bad record fails naming the shard
and its byte offset."""

from __future__ import annotations

import collections
import logging
import re
import sys
import threading

import numpy as np
import tensorflow as tf

__all__ = [
    "RECORD_OVERHEAD",
    "read_shard",
    "reset_skipped_records",
    "skipped_records",
    "tensorflow_read_error",
    "tensorflow_reason",
]

# Bytes a TFRecord adds around each record's data: 8-byte length, 4-byte CRC of it, 4-byte CRC of the data.
RECORD_OVERHEAD = 16

# Shard path -> the indices of its records lost so far: a set, so a record lost again in the next
# epoch (or by another dataset over the same shard) is counted once.
_skipped: dict[str, set[int]] = collections.defaultdict(set)
_skipped_lock = threading.Lock()


def skipped_records() -> dict[str, int]:
    """Distinct records lost per shard path so far in this process, when `ReadConfig.skip_corrupt` is on.

    A record lost in every epoch counts once: the count is how many of the shard's records the
    reader could not deliver, not how many times it failed to.
    """
    with _skipped_lock:
        return {path: len(records) for path, records in _skipped.items() if records}


def reset_skipped_records() -> None:
    """Clears the counts `skipped_records()` returns."""
    with _skipped_lock:
        _skipped.clear()


def _count_skipped(path: bytes, first: np.int64, end: np.int64) -> np.int64:
    with _skipped_lock:
        _skipped[path.decode()].update(range(int(first), int(end)))
    return np.int64(end - first)


# What TensorFlow wraps an eager op's error in: the function's name, the op, an empty name.
_TF_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\](?:\s*name:.*)?$", re.DOTALL)


def tensorflow_reason(message: str) -> str:
    """TensorFlow's error message without its internals: "{{function_node __wrapped__...}} truncated
    record at 28594' failed with Read less bytes than requested [Op:IteratorGetNext] name: " becomes
    "truncated record at 28594"."""
    text = _TF_WRAPPING.sub("", message).split("' failed with ", 1)[0]
    return " ".join(text.split()) or message.strip()


def tensorflow_read_error(path: str) -> str:
    """TensorFlow's own message for the first unreadable record of `path`, "" if it reads to the end.

    It re-reads the file, so it is only called once a read has already gone wrong. For a bad CRC
    TensorFlow says "corrupted record at N", where N is the offset of the part (length or data)
    whose checksum failed.
    """
    # tf_record_iterator (plain Python, safe inside a tf.numpy_function) logs a deprecation warning
    # on first use, which would reach the user's console beside the reason it exists to find.
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        for _ in tf.compat.v1.io.tf_record_iterator(path):
            pass
    except tf.errors.OpError as e:
        return tensorflow_reason(e.message)
    finally:
        tf_logger.setLevel(level)
    return ""


def _read_error_note(path: bytes) -> bytes:
    reason = tensorflow_read_error(path.decode())
    return (f"TensorFlow: {reason}" if reason else "TensorFlow reads it without error: the shard ends early").encode()


# Records per check: the checks run once per chunk, not once per record.
_CHECK_CHUNK = 32


def read_shard(
    path: tf.Tensor,
    expected: tf.Tensor,
    skip: tf.Tensor | int = 0,
    take: tf.Tensor | None = None,
    *,
    expected_bytes: tf.Tensor | int | None = None,
    buffer_size: int,
    skip_corrupt: bool,
    describe_errors: bool = True,
) -> tf.data.Dataset:
    """(serialized record, name) pairs of records `skip` to `skip + take` of one shard, checked
    against the manifest's count for it (`expected`; `take=None` reads to the end).

    A piece reads the records before `skip` (their bytes must be read to find the next record)
    but hands them on to nothing, and stops reading at its end: the rest of the shard belongs to
    another input pipeline. A loss is counted only within the piece, so pipelines that share a
    shard each report the records they lost, and together exactly the records lost.

    TensorFlow's own DataLossError does not say which file is corrupt. So the shard is read with
    `ignore_errors()` (which ends the file at the first bad record) in chunks, an empty chunk marks
    the end, and a running count and byte offset (each record is its data plus RECORD_OVERHEAD
    bytes) are checked there. A short shard fails with an error naming it, the byte offset of its
    first unreadable record and TensorFlow's own reason; with `skip_corrupt` its loss is counted
    and logged instead. Chunking keeps the check's cost per record small; `unbatch` hands on
    single records again.

    A shard that cannot be opened when its turn comes (deleted, or made unreadable, after
    start-up) fails with TensorFlow's NotFoundError (or PermissionDeniedError), which names the
    path, whatever `skip_corrupt`. With `expected_bytes` (the manifest's size of the shard), a
    piece read to the shard's last listed record checks that the records end exactly there: a
    shard replaced after start-up by one whose records differ in size fails, naming it.

    `describe_errors=False` leaves TensorFlow's own reason out of the error (finding it re-reads the
    shard in Python, which a tf.data service worker cannot call back into).

    Each record's name, "shard PATH record I at byte offset O", is for `tf.io.parse_example`'s
    `example_names`: TensorFlow's own parse errors (a missing key, a wrong type) then name the
    shard and the record instead of "<unknown>".
    """
    expected = tf.cast(expected, tf.int64)
    skip = tf.cast(skip, tf.int64)
    end = expected if take is None else skip + tf.cast(take, tf.int64)  # records 0..end-1 are read
    # ignore_errors() retries a file it cannot open for ever, spinning a core (TensorFlow moves on
    # to the next file only after a read error, not after a failed open). So the shard is opened
    # first outside it, reading one byte: a missing or unreadable shard then fails with TensorFlow's
    # own error, which names the path. Only a deletion in the instant between that open and the
    # next one is not covered; a shard deleted while open stays readable (POSIX) and is read to
    # its end.
    opened = (
        tf.data.FixedLengthRecordDataset(path, 1, buffer_size=1)
        .take(1)
        .filter(lambda _: False)  # the byte itself is not a record
    )
    records = opened.concatenate(tf.data.TFRecordDataset(path, buffer_size=buffer_size).ignore_errors()).take(end)
    chunks = records.batch(_CHECK_CHUNK).concatenate(
        tf.data.Dataset.from_tensors(tf.constant([], tf.string))  # end marker: the only empty chunk
    )
    name_prefix = tf.strings.join(["shard ", path, " record "])

    def check(
        state: tuple[tf.Tensor, tf.Tensor], chunk: tf.Tensor
    ) -> tuple[tuple[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
        count, offset = state  # records read so far, and the byte offset where the next one starts
        size = tf.shape(chunk, out_type=tf.int64)[0]
        record_bytes = tf.cast(tf.strings.length(chunk), tf.int64) + RECORD_OVERHEAD
        starts = offset + tf.math.cumsum(record_bytes, exclusive=True)
        names = tf.strings.join(
            [
                name_prefix,
                tf.strings.as_string(count + tf.range(size)),
                " at byte offset ",
                tf.strings.as_string(starts),
            ]
        )
        short = tf.logical_and(tf.equal(size, 0), count < end)

        def on_short() -> tf.Tensor:
            lost = end - tf.maximum(count, skip)  # only this piece's records
            if describe_errors:
                reason = tf.numpy_function(_read_error_note, [path], tf.string)
            else:
                reason = tf.constant("python -m tfdata_readers.verify names the fault")
            if skip_corrupt:
                tf.print(
                    "tfdata_readers: WARNING: skipped",
                    lost,
                    "corrupt or unreadable record(s) of shard",
                    path,
                    "(its records",
                    tf.maximum(count, skip),
                    "to",
                    end - 1,
                    "of",
                    expected,
                    "read by this pipeline; unreadable from byte offset",
                    offset,
                    ":",
                    reason,
                    ")",
                    output_stream=sys.stderr,
                )
                return tf.numpy_function(_count_skipped, [path, tf.maximum(count, skip), end], tf.int64)
            message = tf.strings.join(
                [
                    "corrupt or truncated shard ",
                    path,
                    ": first unreadable record at byte offset ",
                    tf.strings.as_string(offset),
                    " (record ",
                    tf.strings.as_string(count),
                    ") - read ",
                    tf.strings.as_string(count),
                    " of ",
                    tf.strings.as_string(expected),
                    " records the manifest lists; ",
                    reason,
                ]
            )
            failed = tf.debugging.Assert(False, [message], summarize=1)
            with tf.control_dependencies([failed]):
                return tf.identity(lost)

        checked = tf.cond(short, on_short, lambda: tf.constant(0, tf.int64))
        if expected_bytes is not None:
            size_bytes = tf.cast(expected_bytes, tf.int64)
            resized = tf.logical_and(
                tf.logical_and(tf.equal(size, 0), tf.equal(count, expected)),
                tf.logical_and(tf.equal(end, expected), tf.not_equal(offset, size_bytes)),
            )
            message = tf.strings.join(
                [
                    "shard ",
                    path,
                    " changed after start-up: its ",
                    tf.strings.as_string(expected),
                    " records end at byte offset ",
                    tf.strings.as_string(offset),
                    ", but the manifest lists ",
                    tf.strings.as_string(size_bytes),
                    " bytes; it was replaced or rewritten, so its records "
                    "are not those the manifest lists (python -m tfdata_readers.verify checks it)",
                ]
            )
            with tf.control_dependencies([checked]):
                checked = tf.identity(checked)
            checked = tf.group(checked, tf.debugging.Assert(tf.logical_not(resized), [message], summarize=1))
        with tf.control_dependencies([checked]):
            return (count + size, offset + tf.reduce_sum(record_bytes)), (tf.identity(chunk), names)

    initial = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    return chunks.scan(initial, check).unbatch().skip(skip)  # (serialized, name)

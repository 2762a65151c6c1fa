"""Reads a shard's serialized records, named for parse errors; a bad record fails naming the shard
and its byte offset."""

from __future__ import annotations

import collections
import dataclasses
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
    piece = _PieceCheck(
        path=path,
        name_prefix=tf.strings.join(["shard ", path, " record "]),
        expected=expected,
        skip=skip,
        end=end,
        expected_bytes=expected_bytes,
        skip_corrupt=skip_corrupt,
        describe_errors=describe_errors,
    )
    chunks = _chunks_with_end_marker(path, end, buffer_size)  # [serialized], the last one empty
    initial = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))  # (records read, byte offset)
    return chunks.scan(initial, piece.step).unbatch().skip(skip)  # (serialized, name)


def _chunks_with_end_marker(path: tf.Tensor, end: tf.Tensor, buffer_size: int) -> tf.data.Dataset:
    """The shard's first `end` records in chunks of _CHECK_CHUNK, then one empty chunk.

    The records are read with `ignore_errors()`, so a bad record ends them early, and the empty
    chunk is where the check sees how many came.
    """
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
    return records.batch(_CHECK_CHUNK).concatenate(
        tf.data.Dataset.from_tensors(tf.constant([], tf.string))  # end marker: the only empty chunk
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _PieceCheck:
    """The running check of one piece of a shard, as `read_shard` describes it: what the piece's
    records are compared against, and what a shortfall does.

    `step` is the `scan` function; the tensors are those of the piece being read.
    """

    path: tf.Tensor
    name_prefix: tf.Tensor  # "shard PATH record "
    expected: tf.Tensor  # records the manifest lists for the whole shard
    skip: tf.Tensor  # the piece's first record
    end: tf.Tensor  # one past the piece's last record
    expected_bytes: tf.Tensor | int | None
    skip_corrupt: bool
    describe_errors: bool

    def step(
        self, state: tuple[tf.Tensor, tf.Tensor], chunk: tf.Tensor
    ) -> tuple[tuple[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
        """Names the chunk's records, and at the end marker checks that the piece read them all."""
        count, offset = state  # records read so far, and the byte offset where the next one starts
        size = tf.shape(chunk, out_type=tf.int64)[0]
        record_bytes = tf.cast(tf.strings.length(chunk), tf.int64) + RECORD_OVERHEAD
        names = self._record_names(count, offset, size, record_bytes)
        short = tf.logical_and(tf.equal(size, 0), count < self.end)
        checked = tf.cond(short, lambda: self._on_short(count, offset), lambda: tf.constant(0, tf.int64))
        if self.expected_bytes is not None:
            checked = self._check_unchanged(checked, size, count, offset)
        with tf.control_dependencies([checked]):
            return (count + size, offset + tf.reduce_sum(record_bytes)), (tf.identity(chunk), names)

    def _record_names(self, count: tf.Tensor, offset: tf.Tensor, size: tf.Tensor, record_bytes: tf.Tensor) -> tf.Tensor:
        """ "shard PATH record I at byte offset O" for each record of a chunk, for parse errors."""
        starts = offset + tf.math.cumsum(record_bytes, exclusive=True)
        return tf.strings.join(
            [
                self.name_prefix,
                tf.strings.as_string(count + tf.range(size)),
                " at byte offset ",
                tf.strings.as_string(starts),
            ]
        )

    def _on_short(self, count: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
        """The piece's records lost, after counting and logging them (`skip_corrupt`) or failing."""
        first = tf.maximum(count, self.skip)  # only this piece's records
        lost = self.end - first
        if self.describe_errors:
            reason = tf.numpy_function(_read_error_note, [self.path], tf.string)
        else:
            reason = tf.constant("python -m tfdata_readers.verify names the fault")
        if self.skip_corrupt:
            self._warn_skipped(lost, first, offset, reason)
            return tf.numpy_function(_count_skipped, [self.path, first, self.end], tf.int64)
        failed = tf.debugging.Assert(False, [self._short_message(count, offset, reason)], summarize=1)
        with tf.control_dependencies([failed]):
            return tf.identity(lost)

    def _warn_skipped(self, lost: tf.Tensor, first: tf.Tensor, offset: tf.Tensor, reason: tf.Tensor) -> None:
        """Logs the records `skip_corrupt` passes over to stderr, so they are never lost silently."""
        tf.print(
            "tfdata_readers: WARNING: skipped",
            lost,
            "corrupt or unreadable record(s) of shard",
            self.path,
            "(its records",
            first,
            "to",
            self.end - 1,
            "of",
            self.expected,
            "read by this pipeline; unreadable from byte offset",
            offset,
            ":",
            reason,
            ")",
            output_stream=sys.stderr,
        )

    def _short_message(self, count: tf.Tensor, offset: tf.Tensor, reason: tf.Tensor) -> tf.Tensor:
        """The error of a short shard: its path, the byte offset of its first unreadable record, and why."""
        return tf.strings.join(
            [
                "corrupt or truncated shard ",
                self.path,
                ": first unreadable record at byte offset ",
                tf.strings.as_string(offset),
                " (record ",
                tf.strings.as_string(count),
                ") - read ",
                tf.strings.as_string(count),
                " of ",
                tf.strings.as_string(self.expected),
                " records the manifest lists; ",
                reason,
            ]
        )

    def _check_unchanged(self, checked: tf.Tensor, size: tf.Tensor, count: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
        """`checked`, then a check that a shard read to its last record ends at the manifest's size.

        A shard replaced after start-up by one whose records differ in size would otherwise be
        read as if it were the one the manifest lists.
        """
        size_bytes = tf.cast(self.expected_bytes, tf.int64)
        resized = tf.logical_and(
            tf.logical_and(tf.equal(size, 0), tf.equal(count, self.expected)),
            tf.logical_and(tf.equal(self.end, self.expected), tf.not_equal(offset, size_bytes)),
        )
        message = tf.strings.join(
            [
                "shard ",
                self.path,
                " changed after start-up: its ",
                tf.strings.as_string(self.expected),
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
        return tf.group(checked, tf.debugging.Assert(tf.logical_not(resized), [message], summarize=1))

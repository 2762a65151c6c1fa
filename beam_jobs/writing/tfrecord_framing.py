"""TFRecord framing of one record, with google-crc32c: the on-disk format TensorFlow reads.

Written here rather than borrowed: Beam's framing code is private (``tfrecordio._TFRecordUtil``)
and may change without notice, TensorFlow's writer would put TensorFlow in every worker (8 s to
import), and the format is four fields. ``tests/test_tfrecord_framing.py`` pins the bytes against
TensorFlow's own ``tf.io.TFRecordWriter``.
"""

from __future__ import annotations

import struct

import google_crc32c

__all__ = ["RECORD_OVERHEAD", "frame_record", "masked_crc32c"]

# 8-byte length, 4-byte CRC of the length, the data, 4-byte CRC of the data.
RECORD_OVERHEAD = 16
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C of ``data``, rotated and offset as TFRecord requires (a CRC of data that holds
    CRCs is otherwise weak)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """``data`` as one TFRecord: little-endian uint64 length, masked CRC of the length, the data,
    masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", masked_crc32c(length)), data, struct.pack("<I", masked_crc32c(data))))

"""The job's TFRecord framing is byte-identical to TensorFlow's own writer, and TensorFlow reads it."""

from __future__ import annotations

import pytest
import tensorflow as tf

from beam_jobs.writing.tfrecord_framing import RECORD_OVERHEAD, frame_record, masked_crc32c

RECORDS = [b"", b"x", b"\x00" * 1000, bytes(range(256)) * 300, "фото".encode()]


def test_frames_equal_tensorflows_writer(tmp_path):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in RECORDS:
            writer.write(record)
    with open(path, "rb") as handle:
        expected = handle.read()
    assert b"".join(frame_record(r) for r in RECORDS) == expected


def test_tensorflow_reads_our_frames_back(tmp_path):
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(b"".join(frame_record(r) for r in RECORDS))
    assert [t.numpy() for t in tf.data.TFRecordDataset(str(path))] == RECORDS


@pytest.mark.parametrize("record", RECORDS)
def test_overhead_is_sixteen_bytes(record):
    assert len(frame_record(record)) == len(record) + RECORD_OVERHEAD


def test_masked_crc_of_a_known_value():
    # CRC-32C("123456789") is 0xE3069283 (RFC 3720's check value); masked as TFRecord requires.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

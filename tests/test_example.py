"""Example encoding: the wire bytes equal TensorFlow's own, and tf.io.parse_example reads them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from beam_jobs.imaging.example import FEATURE_DTYPES, ExampleFields, encode_pixels, serialize_example, source_id_for
from tests.photos import real_photo

FIELDS = ExampleFields(
    encoded=b"\xff\xd8 pixels",
    format="JPEG",
    height=224,
    width=192,
    channels=3,
    label=7,
    label_text="café",
    filename="café/ünïcode 1.jpg",
    sha256="ab" * 32,
    source_id=source_id_for("café/ünïcode 1.jpg"),
)


def _tf_example(fields: ExampleFields) -> tf.train.Example:
    def b(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def i(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": b(fields.encoded),
                "image/format": b(fields.format.encode()),
                "image/height": i(fields.height),
                "image/width": i(fields.width),
                "image/channels": i(fields.channels),
                "image/class/label": i(fields.label),
                "image/class/text": b(fields.label_text.encode()),
                "image/filename": b(fields.filename.encode()),
                "image/key/sha256": b(fields.sha256.encode()),
                "image/source_id": b(fields.source_id.encode()),
            }
        )
    )


def test_bytes_are_identical_to_tensorflows_deterministic_serialisation():
    assert serialize_example(FIELDS) == _tf_example(FIELDS).SerializeToString(deterministic=True)


def test_parse_example_reads_every_key_with_its_dtype():
    dtypes = {"string": tf.string, "int64": tf.int64}
    spec = {key: tf.io.FixedLenFeature([], dtypes[dtype]) for key, dtype in FEATURE_DTYPES.items()}
    parsed = tf.io.parse_example(tf.constant([serialize_example(FIELDS)] * 2), spec)
    assert parsed["image/class/label"].numpy().tolist() == [7, 7]
    assert parsed["image/class/text"].numpy()[0].decode() == "café"
    assert parsed["image/filename"].numpy()[1].decode() == "café/ünïcode 1.jpg"
    assert parsed["image/height"].numpy()[0] == 224 and parsed["image/width"].numpy()[0] == 192


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
@pytest.mark.parametrize("channels", [1, 3])
def test_encoded_pixels_decode_back_with_tensorflow(encoding, channels):
    image = real_photo("chelsea", (48, 32))
    image = image if channels == 3 else image.convert("L")
    data = encode_pixels(image, encoding=encoding, jpeg_quality=95)
    if encoding == "raw":
        decoded = np.frombuffer(data, np.uint8).reshape(32, 48, channels)
    else:
        decoded = tf.io.decode_image(data, channels=channels).numpy()
    expected = np.asarray(image).reshape(32, 48, channels).astype(int)
    tolerance = 0 if encoding != "jpeg" else 12
    assert decoded.shape == (32, 48, channels)
    assert np.abs(decoded.astype(int) - expected).mean() <= tolerance


def test_encoding_is_deterministic():
    image = real_photo("coffee", (64, 48))
    assert encode_pixels(image, encoding="jpeg", jpeg_quality=90) == encode_pixels(
        image, encoding="jpeg", jpeg_quality=90
    )
    assert serialize_example(FIELDS) == serialize_example(FIELDS)

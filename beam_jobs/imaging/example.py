"""Pure encoding of a preprocessed image into serialized ``tf.train.Example`` bytes."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

from beam_jobs.imaging.annotate import StoredObjects
from beam_jobs.imaging.example_proto import Example

__all__ = [
    "ENCODINGS",
    "FEATURE_DTYPES",
    "FORMAT_NAMES",
    "INSTANCE_MASK_DTYPES",
    "LIST_FEATURE_DTYPES",
    "SEMANTIC_MASK_DTYPES",
    "ExampleFields",
    "encode_array",
    "encode_pixels",
    "serialize_example",
    "source_id_for",
]

ENCODINGS = ("jpeg", "png", "raw")
# The value of image/format for each --encoding.
FORMAT_NAMES = {"jpeg": "JPEG", "png": "PNG", "raw": "RAW"}

# The contract with readers: every key, spelled as TensorFlow's reference image models spell it.
FEATURE_DTYPES: dict[str, str] = {
    "image/encoded": "string",
    "image/format": "string",
    "image/height": "int64",
    "image/width": "int64",
    "image/channels": "int64",
    "image/class/label": "int64",
    "image/class/text": "string",
    "image/filename": "string",
    "image/key/sha256": "string",
    "image/source_id": "string",
}
# --split_groups near_copies: each example's source signature, so that a check of the dataset
# (verify-tfrecords --leakage) and a later append compare what the planner compared.
NEAR_COPY_KEY = "image/near_copy/signature"
# What an annotated example holds instead of, or beside, the keys above (lists of any length),
# spelled as TensorFlow Model Garden's decoders read them (tf_example_decoder.py and
# classification_input.py with is_multilabel).
LIST_FEATURE_DTYPES: dict[str, str] = {
    "image/class/label": "int64",
    "image/class/text": "string",
    "image/object/bbox/xmin": "float32",
    "image/object/bbox/ymin": "float32",
    "image/object/bbox/xmax": "float32",
    "image/object/bbox/ymax": "float32",
    "image/object/class/label": "int64",
    "image/object/class/text": "string",
    "image/object/area": "float32",
    "image/object/is_crowd": "int64",
}
# A dataset with instance masks (the "instance_masks" kind) adds a PNG per object; one with
# semantic masks (the "mask" kind) a PNG per image, with its format.
INSTANCE_MASK_DTYPES: dict[str, str] = {"image/object/mask": "string"}
SEMANTIC_MASK_DTYPES: dict[str, str] = {
    "image/segmentation/class/encoded": "string",
    "image/segmentation/class/format": "string",
}


@dataclass(frozen=True)
class ExampleFields:
    """Everything one record holds, before serialisation."""

    encoded: bytes
    format: str
    height: int
    width: int
    channels: int
    label: int
    label_text: str
    filename: str
    sha256: str
    source_id: str
    # Annotated examples: every class of the image (``label`` and ``label_text`` are then unused)
    # and its objects (annotate.StoredObjects). None: a one-label example, as before.
    labels: tuple[int, ...] | None = None
    label_texts: tuple[str, ...] = ()
    objects: StoredObjects | None = None
    segmentation_png: bytes | None = None  # the semantic mask, a PNG of class ids
    # --split_groups near_copies: the source's perceptual signature (18 bytes; 16 by the legacy method;
    # empty: none found).
    near_copy_signature: bytes | None = None


def encode_pixels(image: Image.Image, *, encoding: str, jpeg_quality: int) -> bytes:
    """Encodes an 8-bit "RGB" or "L" image as JPEG, PNG, or RAW (row-major uint8 H*W*C)."""
    if encoding == "raw":
        return np.asarray(image, dtype=np.uint8).tobytes()
    buffer = io.BytesIO()
    if encoding == "jpeg":
        # optimize=False and no progressive: libjpeg's output is then a pure function of the pixels.
        image.save(buffer, "JPEG", quality=jpeg_quality)
    elif encoding == "png":
        image.save(buffer, "PNG", compress_level=6)
    else:
        raise ValueError(f"encoding must be one of {ENCODINGS} (got {encoding!r})")
    return buffer.getvalue()


def encode_array(pixels: np.ndarray, *, encoding: str, jpeg_quality: int) -> bytes:
    """encode_pixels for an H x W x 3 uint8 array (the job's fast path): JPEG by libjpeg-turbo
    straight from the array (simplejpeg), with Pillow's settings: 4:2:0 chroma subsampling, the
    accurate DCT, no optimisation or progressive scan, so a pure function of the pixels."""
    if encoding == "jpeg" and pixels.ndim == 3 and pixels.shape[2] == 3:
        return simplejpeg.encode_jpeg(
            np.ascontiguousarray(pixels), quality=jpeg_quality, colorspace="RGB", colorsubsampling="420", fastdct=False
        )
    if encoding == "raw":
        return np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()
    return encode_pixels(Image.fromarray(np.ascontiguousarray(pixels)), encoding=encoding, jpeg_quality=jpeg_quality)


def source_id_for(filename: str) -> str:
    """A stable id of an input: hex of the first 8 bytes of sha256 of its relative path."""
    return hashlib.sha256(filename.encode("utf-8")).hexdigest()[:16]


def serialize_example(fields: ExampleFields) -> bytes:
    """Serialises deterministically: protobuf maps are otherwise written in a varying order,
    which would make shard bytes differ from run to run."""
    example = Example()
    feature = example.features.feature

    def put_bytes(key: str, value: bytes) -> None:
        feature[key].bytes_list.value.append(value)

    def put_int(key: str, value: int) -> None:
        feature[key].int64_list.value.append(value)

    put_bytes("image/encoded", fields.encoded)
    put_bytes("image/format", fields.format.encode("ascii"))
    put_int("image/height", fields.height)
    put_int("image/width", fields.width)
    put_int("image/channels", fields.channels)
    if fields.labels is None:
        put_int("image/class/label", fields.label)
        put_bytes("image/class/text", fields.label_text.encode("utf-8"))
    else:
        _put_list(feature, "image/class/label", "int64_list", fields.labels)
        _put_list(feature, "image/class/text", "bytes_list", [text.encode("utf-8") for text in fields.label_texts])
    if fields.objects is not None:
        _put_objects(feature, fields.objects)
    if fields.segmentation_png is not None:
        put_bytes("image/segmentation/class/encoded", fields.segmentation_png)
        put_bytes("image/segmentation/class/format", b"png")
    put_bytes("image/filename", fields.filename.encode("utf-8"))
    put_bytes("image/key/sha256", fields.sha256.encode("ascii"))
    put_bytes("image/source_id", fields.source_id.encode("ascii"))
    if fields.near_copy_signature is not None:
        put_bytes(NEAR_COPY_KEY, fields.near_copy_signature)
    return example.SerializeToString(deterministic=True)


def _put_list(feature: Any, key: str, kind: str, values: Iterable[Any]) -> None:
    """One list feature, present with its kind even when empty: a reader then sees an empty list
    of the right type, where a missing key would fail a parse that expects it."""
    held = getattr(feature[key], kind)
    held.SetInParent()
    held.value.extend(values)


def _put_objects(feature: Any, objects: StoredObjects) -> None:
    """The object lists, every key present even for an image with no object."""
    for index, side in enumerate(("xmin", "ymin", "xmax", "ymax")):
        _put_list(feature, f"image/object/bbox/{side}", "float_list", [box[index] for box in objects.boxes])
    _put_list(feature, "image/object/class/label", "int64_list", objects.label_ids)
    _put_list(feature, "image/object/class/text", "bytes_list", [text.encode("utf-8") for text in objects.label_texts])
    _put_list(feature, "image/object/area", "float_list", objects.areas)
    _put_list(feature, "image/object/is_crowd", "int64_list", objects.is_crowd)
    if objects.masks is not None:
        _put_list(feature, "image/object/mask", "bytes_list", objects.masks)

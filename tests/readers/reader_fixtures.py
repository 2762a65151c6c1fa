"""Writes small datasets in the docs/FORMAT.md layout from real photos, for the reader's tests."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
from collections.abc import Mapping

import numpy as np
import skimage
import sklearn
import tensorflow as tf
from PIL import Image

_SKIMAGE_DATA = pathlib.Path(skimage.__file__).parent / "data"
_SKLEARN_IMAGES = pathlib.Path(sklearn.__file__).parent / "datasets" / "images"
PHOTOS = {
    "astronaut": _SKIMAGE_DATA / "astronaut.png",
    "chelsea": _SKIMAGE_DATA / "chelsea.png",
    "china": _SKLEARN_IMAGES / "china.jpg",
    "coffee": _SKIMAGE_DATA / "coffee.png",
    "flower": _SKLEARN_IMAGES / "flower.jpg",
    "motorcycle_left": _SKIMAGE_DATA / "motorcycle_left.png",
    "rocket": _SKIMAGE_DATA / "rocket.jpg",
}
LABEL_NAMES = sorted(PHOTOS)
_photo_cache: dict[str, Image.Image] = {}


def _photo(name: str) -> Image.Image:
    if name not in _photo_cache:
        _photo_cache[name] = Image.open(PHOTOS[name]).convert("RGB")
    return _photo_cache[name]


def photo_crop(index: int, size: tuple[int, int], rng: np.random.Generator) -> tuple[str, Image.Image]:
    """(label name, a random crop of a real photo resized to size=(width, height))."""
    name = LABEL_NAMES[index % len(LABEL_NAMES)]
    photo = _photo(name)
    side = int(rng.integers(min(photo.size) // 4, min(photo.size)))
    left = int(rng.integers(0, photo.width - side + 1))
    top = int(rng.integers(0, photo.height - side + 1))
    return name, photo.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))


def _encode(image: Image.Image, encoding: str) -> bytes:
    if encoding == "raw":
        return np.asarray(image, np.uint8).tobytes()
    buf = io.BytesIO()
    image.save(buf, format={"jpeg": "JPEG", "png": "PNG"}[encoding], **({"quality": 90} if encoding == "jpeg" else {}))
    return buf.getvalue()


def make_example(
    *,
    encoded: bytes,
    fmt: str,
    height: int,
    width: int,
    channels: int,
    label: int,
    text: str,
    filename: str,
    key: str,
) -> tf.train.Example:
    """A tf.train.Example with exactly the FORMAT.md keys."""

    def b(v: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(v: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": b(encoded),
                "image/format": b(fmt.encode()),
                "image/height": i(height),
                "image/width": i(width),
                "image/channels": i(channels),
                "image/class/label": i(label),
                "image/class/text": b(text.encode()),
                "image/filename": b(filename.encode()),
                "image/key/sha256": b(key.encode()),
                "image/source_id": b(hashlib.sha256(filename.encode()).digest()[:8].hex().encode()),
            }
        )
    )


def _file_sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_dataset(
    out_dir: str | os.PathLike[str],
    *,
    splits: Mapping[str, tuple[int, int]] = {"train": (40, 4)},
    image_size: tuple[int, int] = (32, 32),
    encoding: str = "jpeg",
    seed: int = 0,
) -> pathlib.Path:
    """Writes {split: (num_examples, num_shards)} and dataset_info.json; returns out_dir.

    Examples are dealt round-robin to shards. image_size is (height, width).
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    height, width = image_size
    fmt = encoding.upper()
    split_entries = {}
    for split, (num, num_shards) in splits.items():
        examples: list[list[bytes]] = [[] for _ in range(num_shards)]
        for index in range(num):
            name, crop = photo_crop(index, (width, height), rng)
            source = _encode(crop, "png")  # stands in for the source file the key hashes
            filename = f"{name}/{split}_{index:05d}.png"
            example = make_example(
                encoded=_encode(crop, encoding),
                fmt=fmt,
                height=height,
                width=width,
                channels=3,
                label=LABEL_NAMES.index(name),
                text=name,
                filename=filename,
                key=hashlib.sha256(source + filename.encode()).hexdigest(),
            )
            examples[index % num_shards].append(example.SerializeToString(deterministic=True))
        shards = []
        for shard_index, records in enumerate(examples):
            file = f"{split}-{shard_index:05d}-of-{num_shards:05d}.tfrecord"
            with tf.io.TFRecordWriter(str(out / file)) as writer:
                for record in records:
                    writer.write(record)
            shards.append(
                {
                    "file": file,
                    "num_examples": len(records),
                    "bytes": (out / file).stat().st_size,
                    "sha256": _file_sha256(out / file),
                }
            )
        split_entries[split] = {"num_examples": num, "num_shards": num_shards, "shards": shards}
    features = {
        k: {
            "dtype": "int64"
            if k in ("image/height", "image/width", "image/channels", "image/class/label")
            else "string",
            "shape": [],
        }
        for k in make_example(
            encoded=b"", fmt="", height=0, width=0, channels=0, label=0, text="", filename="", key=""
        ).features.feature
    }
    manifest = {
        "schema_version": 1,
        "producer": {"name": "reader-test-fixtures", "version": "0"},
        "label_names": LABEL_NAMES,
        "num_classes": len(LABEL_NAMES),
        "image": {"height": height, "width": width, "channels": 3, "format": fmt},
        "features": features,
        "preprocessing": {"image_size": [height, width], "channels": 3, "encoding": encoding},
        "splits": split_entries,
        "num_dead_letters": 0,
        "dead_letters_file": "dead_letters.jsonl",
    }
    (out / "dead_letters.jsonl").write_text("")
    tmp = out / "dataset_info.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.rename(out / "dataset_info.json")
    return out


def expected_keys(data_dir: str | os.PathLike[str], split: str) -> list[str]:
    """All image/key/sha256 values of a split, read straight from the shards (no reader code)."""
    manifest = json.loads((pathlib.Path(data_dir) / "dataset_info.json").read_text())
    keys = []
    for shard in manifest["splits"][split]["shards"]:
        for record in tf.data.TFRecordDataset(str(pathlib.Path(data_dir) / shard["file"])):
            example = tf.train.Example.FromString(record.numpy())
            keys.append(example.features.feature["image/key/sha256"].bytes_list.value[0].decode())
    return keys


def pillow_pixels(data_dir: str | os.PathLike[str], split: str) -> dict[str, np.ndarray]:
    """{image/key/sha256: Pillow's RGB decode of the stored image/encoded} of a split, read straight
    from the shards: the pixels the converter promises the reader gives."""
    manifest = json.loads((pathlib.Path(data_dir) / "dataset_info.json").read_text())
    pixels = {}
    for shard in manifest["splits"][split]["shards"]:
        for record in tf.data.TFRecordDataset(str(pathlib.Path(data_dir) / shard["file"])):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            key = feature["image/key/sha256"].bytes_list.value[0].decode()
            encoded = feature["image/encoded"].bytes_list.value[0]
            pixels[key] = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
    return pixels

"""Reads and validates `dataset_info.json`, the manifest the conversion job writes (docs/FORMAT.md)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import tensorflow as tf

from tfdata_readers.config import check_batch_size
from tfdata_readers.schemes import check_readable_location

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "DatasetInfo",
    "ImageInfo",
    "ShardInfo",
    "SplitInfo",
    "load_manifest",
    "read_manifest",
    "shard_file_problem",
    "num_examples",
    "steps_per_epoch",
]

MANIFEST_NAME = "dataset_info.json"
# The newest manifest schema this reader understands; newer manifests are refused.
SCHEMA_VERSION = 1
IMAGE_FORMATS = ("JPEG", "PNG", "RAW")


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split: `path` is absolute (or a gs:// URI), the rest is as the manifest says."""

    path: str
    num_examples: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """A split's example count and its shards, in manifest order."""

    name: str
    num_examples: int
    shards: tuple[ShardInfo, ...]


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """Size and encoding shared by every image of the dataset."""

    height: int
    width: int
    channels: int
    format: str


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """The parsed manifest. `raw` keeps the JSON as read, for fields this reader does not model.

    `data_dir` is absolute (or a URI): a relative one is resolved against the working directory
    once, when the manifest is read."""

    data_dir: str
    label_names: tuple[str, ...]
    num_classes: int
    image: ImageInfo
    features: dict[str, dict[str, Any]]
    splits: dict[str, SplitInfo]
    raw: dict[str, Any]

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise ValueError(
                f"split {name!r} is not in {os.path.join(self.data_dir, MANIFEST_NAME)}; "
                f"expected one of {sorted(self.splits)}"
            )
        return self.splits[name]


def _require(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise ValueError(f"{where}: missing required field {key!r}")
    return mapping[key]


def shard_file_problem(name: object) -> str:
    """Why a shard's `file` entry is not a path inside the data dir ("" if it is one).

    FORMAT.md: `file` is relative to the directory that holds dataset_info.json. An absolute path,
    a URI, or a path with a `..` (or empty, or `.`) component could name any file, such as a shard
    of another dataset, so it is refused rather than joined.
    """
    if not isinstance(name, str) or not name:
        return f"shard file {name!r} is not a file name"
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "://" in name or any(p in ("", ".", "..") for p in parts):
        return (
            f"shard file {name!r} is not a path inside the data dir (FORMAT.md: relative to the directory "
            f"of {MANIFEST_NAME}, with no absolute path, URI, '.', '..' or empty component)"
        )
    return ""


def read_manifest(data_dir: str | os.PathLike[str]) -> tuple[DatasetInfo, list[str]]:
    """(the parsed manifest, its structural problems): what `load_manifest` refuses, listed instead.

    A manifest that cannot be parsed at all (no file, bad JSON, a newer schema_version, a missing
    field, counts that disagree with their shards) still raises. The problems listed are those a
    hand edit makes while the file still parses: a shard file listed twice (in one split or in two,
    so training and validation would share examples), a shard path leaving the data dir,
    `num_classes` differing from the number of `label_names`, and a split's `num_shards` differing
    from its shard list.
    """
    data_dir = os.fspath(data_dir)
    check_readable_location(data_dir)
    if "://" not in data_dir:
        # Resolved once, here: every path the reader keeps (the manifest's, each shard's) is then
        # absolute, so a later os.chdir cannot make the same dataset read another folder's shards.
        data_dir = os.path.abspath(data_dir)
    path = os.path.join(data_dir, MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"no manifest at {path}; was the conversion job run into {data_dir!r}?")
    with tf.io.gfile.GFile(path, "r") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}; expected an object")
    version = _require(raw, "schema_version", path)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {version!r}; this reader knows versions up to {SCHEMA_VERSION}"
        )
    image = _require(raw, "image", path)
    image_info = ImageInfo(
        height=int(_require(image, "height", f"{path} image")),
        width=int(_require(image, "width", f"{path} image")),
        channels=int(_require(image, "channels", f"{path} image")),
        format=str(_require(image, "format", f"{path} image")).upper(),
    )
    if image_info.format not in IMAGE_FORMATS:
        raise ValueError(f"{path}: image format {image_info.format!r}; expected one of {IMAGE_FORMATS}")
    if image_info.channels not in (1, 3):
        raise ValueError(f"{path}: image channels {image_info.channels!r}; expected 1 or 3")
    problems: list[str] = []
    listed: dict[str, str] = {}  # shard file -> the split that lists it first
    splits = {}
    for name, split in _require(raw, "splits", path).items():
        where = f"{path} split {name!r}"
        entries = _require(split, "shards", where)
        shards = []
        for s in entries:
            file = _require(s, "file", where)
            if problem := shard_file_problem(file):
                problems.append(f"split {name!r}: {problem}")
            elif file in listed:
                problems.append(
                    f"shard file {file!r} is listed twice in split {name!r}" if listed[file] == name else
                    f"shard file {file!r} is listed in splits {listed[file]!r} and {name!r}: their examples would overlap"
                )
            else:
                listed[file] = name
            shards.append(ShardInfo(
                path=os.path.join(data_dir, str(file)),
                num_examples=int(_require(s, "num_examples", where)),
                bytes=int(_require(s, "bytes", where)),
                sha256=str(_require(s, "sha256", where)),
            ))
        total = int(_require(split, "num_examples", where))
        if total != sum(s.num_examples for s in shards):
            raise ValueError(
                f"{where}: num_examples is {total} but its shards hold {sum(s.num_examples for s in shards)}"
            )
        if "num_shards" in split and split["num_shards"] != len(shards):
            problems.append(f"split {name!r} says num_shards {split['num_shards']!r} but lists {len(shards)} shard(s)")
        splits[name] = SplitInfo(name=name, num_examples=total, shards=tuple(shards))
    label_names = _require(raw, "label_names", path)
    if not isinstance(label_names, list) or not all(isinstance(n, str) for n in label_names):
        raise ValueError(f"{path}: label_names must be a list of strings (got {label_names!r})")
    num_classes = _require(raw, "num_classes", path)
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes != len(label_names):
        problems.append(f"num_classes is {num_classes!r} but label_names holds {len(label_names)} name(s)")
    info = DatasetInfo(
        data_dir=data_dir,
        label_names=tuple(label_names),
        num_classes=num_classes if isinstance(num_classes, int) else len(label_names),
        image=image_info,
        features=dict(_require(raw, "features", path)),
        splits=splits,
        raw=raw,
    )
    return info, problems


def load_manifest(data_dir: str | os.PathLike[str]) -> DatasetInfo:
    """Reads `data_dir/dataset_info.json` (local path or gs://) and checks its structure.

    Besides a file it cannot parse, it refuses a shard file listed twice or in two splits, a shard
    path leaving the data dir, `num_classes` differing from `len(label_names)`, and a split's
    `num_shards` differing from its shard list (see `read_manifest`), naming each problem. It
    reads only the manifest: what the shards hold is `verify`'s to check.
    """
    info, problems = read_manifest(data_dir)
    if problems:
        raise ValueError(f"{os.path.join(info.data_dir, MANIFEST_NAME)}: " + "; ".join(problems))
    return info


def num_examples(data_dir: str | os.PathLike[str], split: str) -> int:
    """The number of examples of `split`, from the manifest."""
    return load_manifest(data_dir).split(split).num_examples


def steps_per_epoch(
    data_dir: str | os.PathLike[str], split: str, global_batch_size: int, *, drop_remainder: bool = True
) -> int:
    """Batches per epoch of `split` at `global_batch_size`: floor with `drop_remainder`, else ceil."""
    check_batch_size("global_batch_size", global_batch_size)
    n = num_examples(data_dir, split)
    return n // global_batch_size if drop_remainder else math.ceil(n / global_batch_size)

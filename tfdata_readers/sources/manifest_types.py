"""The manifest's types, and its parsing from JSON: no TensorFlow, no file access.

What the reader returns from load_manifest and what the conversion job's convert() returns is one
type, DatasetInfo; both the reader and the job import it from here, so that typing a manifest never
pays TensorFlow's import (the job's launching process does not otherwise import it).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator, KeysView
from typing import Any

__all__ = [
    "IMAGE_FORMATS",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "TASKS",
    "VERSIONS_DIR",
    "DatasetInfo",
    "ImageInfo",
    "ShardInfo",
    "SplitInfo",
    "parse_manifest",
    "relative_file_problem",
    "shard_file_problem",
    "versions_of",
]

MANIFEST_NAME = "dataset_info.json"
# The newest manifest schema this reader understands; newer manifests are refused.
# 2: images may keep their own size (image height and width null), and examples may hold lists
# (an annotated dataset's `task`: "multi_label" or "detection"). Version 1 manifests read as before.
SCHEMA_VERSION = 2
TASKS = ("classification", "multi_label", "detection", "segmentation")
IMAGE_FORMATS = ("JPEG", "PNG", "RAW")
# docs/FORMAT.md: every committed version's manifest is kept as versions/<8-digit version>.json.
VERSIONS_DIR = "versions"


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split: `path` is absolute (or a gs:// URI), `file` the manifest's entry
    (relative to the data dir, e.g. shards/<run>/train-00000-of-00004.tfrecord), the rest is as
    the manifest says."""

    path: str
    num_examples: int
    bytes: int
    sha256: str
    file: str = ""


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """A split's example count and its shards, in manifest order."""

    name: str
    num_examples: int
    shards: tuple[ShardInfo, ...]


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """Size and encoding shared by every image of the dataset. ``height`` and ``width`` are None
    when each image keeps its own size (the converter's ``--resize_mode keep``)."""

    height: int | None
    width: int | None
    channels: int
    format: str

    @property
    def keeps_size(self) -> bool:
        """True when the images are of varying sizes: the reader needs an output size to batch them."""
        return self.height is None or self.width is None

    @property
    def size_text(self) -> str:
        """The size as WIDTHxHEIGHT, or "own sizes" when each image keeps its own."""
        return "own sizes" if self.keeps_size else f"{self.width}x{self.height}"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """The parsed manifest of one version. `raw` keeps the JSON as read, for fields this reader does not model.

    `data_dir` is absolute (or a URI): a relative one is resolved against the working directory
    once, when the manifest is read. `version` is the dataset version this manifest describes (1
    for a manifest written before datasets were versioned), `parent_version` the one it was made
    from (None for the first). `manifest_path` is the file it was read from: the root
    dataset_info.json for the current version, else versions/<version>.json."""

    data_dir: str
    label_names: tuple[str, ...]
    num_classes: int
    image: ImageInfo
    features: dict[str, dict[str, Any]]
    splits: dict[str, SplitInfo]
    raw: dict[str, Any]
    version: int = 1
    parent_version: int | None = None
    manifest_path: str = ""

    def __post_init__(self) -> None:
        if not self.manifest_path:  # frozen: set through object.__setattr__
            object.__setattr__(self, "manifest_path", os.path.join(self.data_dir, MANIFEST_NAME))

    @property
    def task(self) -> str:
        """ "classification" (one label an example), "multi_label", "detection" (lists of classes, and
        boxes) or "segmentation" (a mask of class ids)."""
        return str(self.raw.get("task", "classification"))

    @property
    def category_ids(self) -> dict[str, int]:
        """{class name: its COCO category id} for a dataset made from COCO files, else {}: a
        prediction's class id `i` is COCO's `category_ids[label_names[i]]`, as COCO's evaluation expects."""
        return {str(name): int(ident) for name, ident in self.raw.get("category_ids", {}).items()}

    # Read access to the manifest as JSON, so that code written for the dict the job once returned
    # (info["splits"]["train"]["num_examples"]) reads the same; to_json() is the dict to write.
    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def __hash__(self) -> int:
        # Equal infos are one version of one folder: these three say which (raw, a dict, cannot hash).
        return hash((self.data_dir, self.version, self.manifest_path))

    def __repr__(self) -> str:
        # The facts a notebook wants at a glance; every shard is in `splits` and in `raw`.
        splits = ", ".join(
            f"{name!r}: {split.num_examples} examples in {len(split.shards)} shards"
            for name, split in self.splits.items()
        )
        return (
            f"DatasetInfo(data_dir={self.data_dir!r}, version={self.version}, task={self.task!r}, "
            f"num_classes={self.num_classes}, image={self.image.size_text} {self.image.format}, splits={{{splits}}})"
        )

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        """The manifest's field ``key`` as JSON, or ``default``."""
        return self.raw.get(key, default)

    def keys(self) -> KeysView[str]:
        """The manifest's field names (with __getitem__, ``dict(info)`` is the JSON's top level)."""
        return self.raw.keys()

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON (a deep copy: changing it changes nothing here)."""
        return copy.deepcopy(self.raw)

    def split(self, name: str) -> SplitInfo:
        """The split called ``name``; a ValueError naming the splits there are, rather than a bare KeyError."""
        if name not in self.splits:
            raise ValueError(f"split {name!r} is not in {self.manifest_path}; expected one of {sorted(self.splits)}")
        return self.splits[name]


def _require(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise ValueError(f"{where}: missing required field {key!r}")
    return mapping[key]


def relative_file_problem(name: object, what: str) -> str:
    """Why a manifest's file entry (`what`: "shard file", "dead_letters_file") is not a path inside
    the data dir ("" if it is one).

    FORMAT.md: such a path is relative to the directory that holds dataset_info.json and uses
    POSIX separators; it may name a subfolder (`shards/<run>/train-00000-of-00004.tfrecord`). An
    absolute path, a URI, a backslash, or a `..` (or empty, or `.`) component could name any file,
    such as a shard of another dataset, so it is refused rather than joined.
    """
    if not isinstance(name, str) or not name:
        return f"{what} {name!r} is not a file name"
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "://" in name or any(p in ("", ".", "..") for p in parts):
        return (
            f"{what} {name!r} is not a path inside the data dir (FORMAT.md: relative to the directory "
            f"of {MANIFEST_NAME}, '/'-separated, with no absolute path, URI, backslash, '.', '..' or empty component)"
        )
    return ""


def shard_file_problem(name: object) -> str:
    """Why a shard's `file` entry is not a path inside the data dir ("" if it is one); see `relative_file_problem`."""
    return relative_file_problem(name, "shard file")


def versions_of(raw: dict[str, Any], path: str) -> tuple[int, int | None]:
    """(version, parent_version) of a parsed manifest; (1, None) for one written before versioning."""
    if "version" not in raw:
        return 1, None  # FORMAT.md: a dataset written before versioning is version 1, with no parent
    version, parent = raw["version"], raw.get("parent_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"{path}: version must be an int >= 1 (got {version!r})")
    if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool) or not 1 <= parent < version):
        raise ValueError(f"{path}: parent_version must be null or an int from 1 to {version - 1} (got {parent!r})")
    return version, parent


def parse_manifest(raw: dict[str, Any], *, data_dir: str, path: str) -> tuple[DatasetInfo, list[str]]:
    """(the manifest ``raw``, read from ``path`` in ``data_dir``, as a DatasetInfo; its structural
    problems). Pure: read_manifest reads the file, and the job's convert() types what it committed."""
    schema = _require(raw, "schema_version", path)
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise ValueError(f"{path} has schema_version {schema!r}; this reader knows versions up to {SCHEMA_VERSION}")
    dataset_version, parent_version = versions_of(raw, path)
    task = raw.get("task", "classification")
    if task not in TASKS:
        raise ValueError(f"{path}: task {task!r}; this reader knows {TASKS}")
    image_info = _image_info(_require(raw, "image", path), schema, path)
    problems: list[str] = []
    splits = _splits(_require(raw, "splits", path), data_dir, path, problems)
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
        version=dataset_version,
        parent_version=parent_version,
        manifest_path=path,
    )
    return info, problems


def _image_info(image: dict[str, Any], schema: int, path: str) -> ImageInfo:
    """The manifest's ``image`` entry, checked: sizes (both null only from schema 2), channels, format."""
    height, width = _require(image, "height", f"{path} image"), _require(image, "width", f"{path} image")
    if (height is None) != (width is None) or (height is None and schema < 2):
        raise ValueError(f"{path}: image height {height!r} and width {width!r} must both be sizes, or both null")
    image_info = ImageInfo(
        height=None if height is None else int(height),
        width=None if width is None else int(width),
        channels=int(_require(image, "channels", f"{path} image")),
        format=str(_require(image, "format", f"{path} image")).upper(),
    )
    if image_info.format not in IMAGE_FORMATS:
        raise ValueError(f"{path}: image format {image_info.format!r}; expected one of {IMAGE_FORMATS}")
    if image_info.channels not in (1, 3):
        raise ValueError(f"{path}: image channels {image_info.channels!r}; expected 1 or 3")
    return image_info


def _splits(split_entries: dict[str, Any], data_dir: str, path: str, problems: list[str]) -> dict[str, SplitInfo]:
    """The manifest's ``splits``, each shard's path joined to ``data_dir``; a hand edit's problems
    (a shard listed twice or in two splits, a path leaving the data dir, a wrong num_shards) are
    appended to ``problems``, counts that disagree with their shards raise."""
    listed: dict[str, str] = {}  # shard file -> the split that lists it first
    splits = {}
    for name, split in split_entries.items():
        where = f"{path} split {name!r}"
        shards = []
        for entry in _require(split, "shards", where):
            file = _require(entry, "file", where)
            if problem := shard_file_problem(file):
                problems.append(f"split {name!r}: {problem}")
            elif file in listed:
                problems.append(
                    f"shard file {file!r} is listed twice in split {name!r}"
                    if listed[file] == name
                    else f"shard file {file!r} is listed in splits {listed[file]!r} and {name!r}: "
                    "their examples would overlap"
                )
            else:
                listed[file] = name
            shards.append(
                ShardInfo(
                    path=os.path.join(data_dir, str(file)),
                    num_examples=int(_require(entry, "num_examples", where)),
                    bytes=int(_require(entry, "bytes", where)),
                    sha256=str(_require(entry, "sha256", where)),
                    file=str(file),
                )
            )
        total = int(_require(split, "num_examples", where))
        if total != sum(s.num_examples for s in shards):
            raise ValueError(
                f"{where}: num_examples is {total} but its shards hold {sum(s.num_examples for s in shards)}"
            )
        if "num_shards" in split and split["num_shards"] != len(shards):
            problems.append(f"split {name!r} says num_shards {split['num_shards']!r} but lists {len(shards)} shard(s)")
        splits[name] = SplitInfo(name=name, num_examples=total, shards=tuple(shards))
    return splits

"""Reads and validates `dataset_info.json`, the manifest the conversion job writes (docs/FORMAT.md)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any

import tensorflow as tf

from tfdata_readers.config import check_batch_size
from tfdata_readers.sources import storage
from tfdata_readers.sources.schemes import check_readable_location

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "VERSIONS_DIR",
    "DatasetInfo",
    "ImageInfo",
    "ShardInfo",
    "SplitInfo",
    "VersionNotFoundError",
    "check_version",
    "current_version",
    "history_files",
    "load_manifest",
    "manifest_versions",
    "read_manifest",
    "relative_file_problem",
    "shard_file_problem",
    "num_examples",
    "steps_per_epoch",
    "version_manifest_path",
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
_VERSION_FILE = re.compile(r"^(\d{8})\.json$")


class VersionNotFoundError(FileNotFoundError):
    """The version asked for has no manifest in the data dir; the message names the versions that have one."""


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


def check_version(version: object) -> int | None:
    """`version` if it is None or an int >= 1 (not a bool); else a ValueError naming it."""
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise ValueError(f"version must be None (the current version) or an int >= 1 (got {version!r})")
    return version


def version_manifest_path(data_dir: str, version: int) -> str:
    """Where the history copy of `version`'s manifest lives: DATA_DIR/versions/00000003.json."""
    return os.path.join(data_dir, VERSIONS_DIR, f"{version:08d}.json")


def manifest_versions(data_dir: str) -> list[int]:
    """The versions that have a history manifest in DATA_DIR/versions/, ascending ([] without that folder)."""
    folder = os.path.join(data_dir, VERSIONS_DIR)
    if not storage.isdir(folder):
        return []
    found = (_VERSION_FILE.match(name.rstrip("/")) for name in storage.listdir(folder))
    return sorted(int(m[1]) for m in found if m and int(m[1]) >= 1)


def _load_json(path: str) -> dict[str, Any]:
    try:
        raw = json.loads(storage.read_bytes(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}; expected an object")
    return raw


def _versions_of(raw: dict[str, Any], path: str) -> tuple[int, int | None]:
    """(version, parent_version) of a parsed manifest; (1, None) for one written before versioning."""
    if "version" not in raw:
        return 1, None  # FORMAT.md: a dataset written before versioning is version 1, with no parent
    version, parent = raw["version"], raw.get("parent_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"{path}: version must be an int >= 1 (got {version!r})")
    if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool) or not 1 <= parent < version):
        raise ValueError(f"{path}: parent_version must be null or an int from 1 to {version - 1} (got {parent!r})")
    return version, parent


def _not_found(data_dir: str, version: int, current: int | None) -> VersionNotFoundError:
    kept = sorted(set(manifest_versions(data_dir)) | ({current} if current else set()))
    listed = ", ".join(map(str, kept)) or "none"
    now = f"; the current version is {current}" if current else f"; {os.path.join(data_dir, MANIFEST_NAME)} is missing"
    return VersionNotFoundError(
        f"version {version} of {data_dir} has no manifest (neither the current {MANIFEST_NAME} nor "
        f"{version_manifest_path(data_dir, version)}): versions with a manifest: {listed}{now}"
    )


def _locate(data_dir: str, version: int | None) -> tuple[str, dict[str, Any]]:
    """(path, parsed JSON) of the manifest of `version` (None: the current one, the root file).

    The root dataset_info.json is the commit point and so authoritative for the current version:
    it is read first, and versions/N.json only when the root is another version (its history copy
    may not be written yet right after a commit).
    """
    root = os.path.join(data_dir, MANIFEST_NAME)
    root_raw = _load_json(root) if storage.exists(root) else None
    if version is None:
        if root_raw is None:
            raise FileNotFoundError(f"no manifest at {root}; was the conversion job run into {data_dir!r}?")
        return root, root_raw
    current = _versions_of(root_raw, root)[0] if root_raw is not None else None
    if root_raw is not None and current == version:
        return root, root_raw
    path = version_manifest_path(data_dir, version)
    if not storage.exists(path):
        raise _not_found(data_dir, version, current)
    raw = _load_json(path)
    held = _versions_of(raw, path)[0]
    if held != version:
        raise ValueError(f"{path} holds version {held}, not {version}: the history is inconsistent")
    return path, raw


def current_version(data_dir: str | os.PathLike[str]) -> int | None:
    """The version the root dataset_info.json holds now (1 for one written before versioning), None without one."""
    data_dir = os.fspath(data_dir)
    root = os.path.join(data_dir, MANIFEST_NAME)
    if not storage.exists(root):
        return None
    return _versions_of(_load_json(root), root)[0]


def history_files(data_dir: str) -> set[str]:
    """The shard `file` entries of every history manifest in DATA_DIR/versions/ (unreadable ones skipped).

    Old versions' files stay in the data dir for the writer's retention window, so a file one of
    them lists is expected there even when the version being read does not list it.
    """
    files: set[str] = set()
    for version in manifest_versions(data_dir):
        try:
            raw = _load_json(version_manifest_path(data_dir, version))
            files.update(
                str(s.get("file")) for split in raw.get("splits", {}).values() for s in split.get("shards", [])
            )
        except (ValueError, AttributeError, TypeError, tf.errors.OpError):
            continue  # a damaged history file lists nothing; verify reports the version it reads
    return files


def read_manifest(data_dir: str | os.PathLike[str], version: int | None = None) -> tuple[DatasetInfo, list[str]]:
    """(the parsed manifest, its structural problems): what `load_manifest` refuses, listed instead.

    `version`: None reads the current version (the root dataset_info.json); N reads the root if it
    is version N, else versions/<N:08d>.json, else raises `VersionNotFoundError` naming the
    versions that have a manifest.

    A manifest that cannot be parsed at all (no file, bad JSON, a newer schema_version, a missing
    field, counts that disagree with their shards) still raises. The problems listed are those a
    hand edit makes while the file still parses: a shard file listed twice (in one split or in two,
    so training and validation would share examples), a shard path leaving the data dir,
    `num_classes` differing from the number of `label_names`, and a split's `num_shards` differing
    from its shard list.
    """
    data_dir = os.fspath(data_dir)
    check_readable_location(data_dir)
    check_version(version)
    if "://" not in data_dir:
        # Resolved once, here: every path the reader keeps (the manifest's, each shard's) is then
        # absolute, so a later os.chdir cannot make the same dataset read another folder's shards.
        data_dir = os.path.abspath(data_dir)
    path, raw = _locate(data_dir, version)
    schema = _require(raw, "schema_version", path)
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise ValueError(f"{path} has schema_version {schema!r}; this reader knows versions up to {SCHEMA_VERSION}")
    dataset_version, parent_version = _versions_of(raw, path)
    image = _require(raw, "image", path)
    height, width = _require(image, "height", f"{path} image"), _require(image, "width", f"{path} image")
    if (height is None) != (width is None) or (height is None and schema < 2):
        raise ValueError(f"{path}: image height {height!r} and width {width!r} must both be sizes, or both null")
    task = raw.get("task", "classification")
    if task not in TASKS:
        raise ValueError(f"{path}: task {task!r}; this reader knows {TASKS}")
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
                    num_examples=int(_require(s, "num_examples", where)),
                    bytes=int(_require(s, "bytes", where)),
                    sha256=str(_require(s, "sha256", where)),
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


def load_manifest(data_dir: str | os.PathLike[str], version: int | None = None) -> DatasetInfo:
    """Reads the manifest of `version` of `data_dir` (local path, gs:// or s3://) and checks its structure.

    `version=None` (default) is the current version, `data_dir/dataset_info.json`; an int N is
    that version (the root if it is N, else `data_dir/versions/<N:08d>.json`), and a version with
    no manifest is a `VersionNotFoundError` naming those that have one. The manifest is read once:
    a reader built on it keeps reading that version's files, whatever is committed later.

    Besides a file it cannot parse, it refuses a shard file listed twice or in two splits, a shard
    path leaving the data dir, `num_classes` differing from `len(label_names)`, and a split's
    `num_shards` differing from its shard list (see `read_manifest`), naming each problem. It
    reads only the manifest: what the shards hold is `verify`'s to check.
    """
    info, problems = read_manifest(data_dir, version)
    if problems:
        raise ValueError(f"{info.manifest_path}: " + "; ".join(problems))
    return info


def num_examples(data_dir: str | os.PathLike[str], split: str, *, version: int | None = None) -> int:
    """The number of examples of `split` in `version` (None: the current one), from the manifest."""
    return load_manifest(data_dir, version).split(split).num_examples


def steps_per_epoch(
    data_dir: str | os.PathLike[str],
    split: str,
    global_batch_size: int,
    *,
    drop_remainder: bool = True,
    version: int | None = None,
) -> int:
    """Batches per epoch of `split` of `version` (None: the current one) at `global_batch_size`:
    floor with `drop_remainder`, else ceil."""
    check_batch_size("global_batch_size", global_batch_size)
    n = num_examples(data_dir, split, version=version)
    return n // global_batch_size if drop_remainder else math.ceil(n / global_batch_size)

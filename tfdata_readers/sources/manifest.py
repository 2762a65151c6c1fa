"""Reads and validates `dataset_info.json`, the manifest the conversion job writes (docs/FORMAT.md)."""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
from typing import Any

import tensorflow as tf

from tfdata_readers.config import check_batch_size
from tfdata_readers.sources import storage
from tfdata_readers.sources.manifest_types import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    VERSIONS_DIR,
    DatasetInfo,
    ImageInfo,
    ShardInfo,
    SplitInfo,
    parse_manifest,
    relative_file_problem,
    shard_file_problem,
    versions_of,
)
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
    "read_shard_sidecar",
    "relative_file_problem",
    "shard_file_problem",
    "num_examples",
    "steps_per_epoch",
    "version_manifest_path",
]

_VERSION_FILE = re.compile(r"^(\d{8})\.json$")


class VersionNotFoundError(FileNotFoundError):
    """The version asked for has no manifest in the data dir; the message names the versions that have one."""


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


def read_shard_sidecar(shard_path: str) -> dict[str, Any] | None:
    """The job's sidecar of one shard (``.<shard name>.json`` beside it, docs/FORMAT.md): what each
    input was (``input_filenames``, ``input_user_groups``, ...); None where it cannot be read, as
    in a dataset copied without its hidden files."""
    folder, name = posixpath.split(shard_path)
    try:
        sidecar = json.loads(storage.read_bytes(posixpath.join(folder, f".{name}.json")).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return sidecar if isinstance(sidecar, dict) else None


def _load_json(path: str) -> dict[str, Any]:
    try:
        raw = json.loads(storage.read_bytes(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}; expected an object")
    return raw


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
    current = versions_of(root_raw, root)[0] if root_raw is not None else None
    if root_raw is not None and current == version:
        return root, root_raw
    path = version_manifest_path(data_dir, version)
    if not storage.exists(path):
        raise _not_found(data_dir, version, current)
    raw = _load_json(path)
    held = versions_of(raw, path)[0]
    if held != version:
        raise ValueError(f"{path} holds version {held}, not {version}: the history is inconsistent")
    return path, raw


def current_version(data_dir: str | os.PathLike[str]) -> int | None:
    """The version the root dataset_info.json holds now (1 for one written before versioning), None without one."""
    data_dir = os.fspath(data_dir)
    root = os.path.join(data_dir, MANIFEST_NAME)
    if not storage.exists(root):
        return None
    return versions_of(_load_json(root), root)[0]


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
    return parse_manifest(raw, data_dir=data_dir, path=path)


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

"""Reading a folder's versions: the current one, the history walked from it, and the files there."""

from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems

from beam_jobs.storage import list_tree
from beam_jobs.versions.manifests import VersionNotFoundError, _with_version
from beam_jobs.writing.commit import (
    _parse,
    _store,
    read_current,
    version_file,
)


def _read_history_file(output_dir: str, version: int) -> dict | None:
    path = FileSystems.join(output_dir, version_file(version))
    data, _ = _store(output_dir).read(path)
    return None if data is None else _with_version(_parse(path, data))


def _no_dataset(output_dir: str) -> VersionNotFoundError:
    return VersionNotFoundError(f"{output_dir} holds no dataset_info.json: no version was committed there")


def history(output_dir: str) -> list[dict]:
    """The committed versions' manifests, newest first, walking parent_version from the root.

    The root is authoritative for the current version (its copy in versions/ may be missing after
    a kill right after the commit). The walk stops where a history manifest is missing.
    """
    current = read_current(output_dir)
    if current.manifest is None:
        raise _no_dataset(output_dir)
    chain = [_with_version(current.manifest)]
    seen = {chain[0]["version"]}
    parent = chain[0].get("parent_version")
    while isinstance(parent, int) and parent not in seen:
        manifest = _read_history_file(output_dir, parent)
        if manifest is None:
            break
        chain.append(manifest)
        seen.add(parent)
        parent = manifest.get("parent_version")
    return chain


def load_version(output_dir: str, version: int | None = None) -> dict:
    """The manifest of ``version`` (None: the current one, the root dataset_info.json)."""
    current = read_current(output_dir)
    if current.manifest is None:
        raise _no_dataset(output_dir)
    if version is None or version == current.version:
        return _with_version(current.manifest)
    manifest = _read_history_file(output_dir, version) if version >= 1 else None
    if manifest is None or manifest.get("version") != version:
        kept = ", ".join(str(m["version"]) for m in history(output_dir))
        raise VersionNotFoundError(f"version {version} is not kept in {output_dir}; kept versions: {kept}")
    return manifest


def kept_versions(output_dir: str, keep: int) -> list[int]:
    """The versions inside a retention window of ``keep``: the current one and the keep-1 before it."""
    _check_keep(keep)
    return [m["version"] for m in history(output_dir)[:keep]]


def _check_keep(keep: int) -> None:
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(
            f"keep must be a whole number of at least 1 (got {keep!r}): the current version is always kept"
        )


def _existing(output_dir: str) -> dict[str, int]:
    """{path relative to OUT: size} of every file under OUT, from one listing."""
    root = output_dir.rstrip("/") + "/"
    if "://" not in output_dir:
        root = os.path.abspath(output_dir).rstrip("/") + "/"
    files = {}
    for meta in list_tree(output_dir):
        path = meta.path if "://" in meta.path else os.path.abspath(meta.path)
        if path.startswith(root):
            files[path[len(root) :]] = meta.size_in_bytes
    return files

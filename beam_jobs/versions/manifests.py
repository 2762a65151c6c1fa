"""What a manifest lists, worked out from the manifest alone. Pure: no file is read here.

A manifest's file names are checked before any is used (``_safe_relative``), so that no entry can
name a file outside the dataset folder to be opened, kept or deleted.
"""

from __future__ import annotations

import posixpath

from beam_jobs.errors import JobError


class VersionNotFoundError(JobError):
    """The version asked for is not kept (or the folder holds no dataset); names those that are."""


def _safe_relative(name: object) -> str | None:
    """``name`` if it is a relative POSIX path inside OUT, else None: a manifest entry that could
    name a file outside the dataset folder is never opened, kept or deleted because of it."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "://" in name:
        return None
    if any(part in ("", ".", "..") for part in name.split("/")):
        return None
    return name


def _with_version(manifest: dict) -> dict:
    """A manifest of an older release (no ``version``) is version 1, with no parent."""
    return {"version": 1, "parent_version": None, **manifest}


def shard_files(manifest: dict, split: str | None = None) -> list[str]:
    """The shard files a manifest lists (of one split, or all), relative to OUT, in manifest order."""
    splits = manifest.get("splits") or {}
    if split is not None and split not in splits:
        raise VersionNotFoundError(
            f"version {manifest.get('version', 1)} has no split {split!r}; it has {', '.join(sorted(splits)) or 'none'}"
        )
    names = []
    for name, facts in splits.items():
        if split is None or name == split:
            names += [f for f in (_safe_relative(s.get("file")) for s in facts.get("shards", [])) if f]
    return names


def _sidecars(shard: str) -> list[str]:
    """The per-shard sidecars a shard may have beside it: ``.NAME.json`` (a run folder) and
    ``.staged-NAME.json`` (the flat layout of older releases)."""
    folder, name = posixpath.split(shard)
    return [posixpath.join(folder, f".{name}.json"), posixpath.join(folder, f".staged-{name}.json")]


def listed_files(manifest: dict) -> set[str]:
    """Every file a version owns, relative to OUT: its shards, their sidecars, its dead letters."""
    files = set()
    for shard in shard_files(manifest):
        files.add(shard)
        files.update(_sidecars(shard))
    dead = _safe_relative(manifest.get("dead_letters_file"))
    if dead:
        files.add(dead)
    return files


def _shard_sizes(manifest: dict) -> dict[str, int | None]:
    return {
        f: s.get("bytes")
        for facts in (manifest.get("splits") or {}).values()
        for s in facts.get("shards", [])
        if (f := _safe_relative(s.get("file")))
    }


def _missing_files(manifest: dict, existing: dict[str, int]) -> list[str]:
    """Files of ``manifest`` that are gone: shards (or no longer their listed size), and its dead
    letters, without which `verify` fails the version (the format says they are always present)."""
    missing = [
        f
        for f, size in _shard_sizes(manifest).items()
        if f not in existing or (size is not None and existing[f] != size)
    ]
    dead = _safe_relative(manifest.get("dead_letters_file"))
    if dead and dead not in existing:
        missing.append(dead)
    return missing

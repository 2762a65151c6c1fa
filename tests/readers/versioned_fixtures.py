"""Test code: builds versioned datasets (docs/FORMAT.md's shards/<run>/ + versions/ layout) for the reader's tests.

The reader is tested against the versioned layout before the conversion job writes it. So the
tests run the current job (or `reader_fixtures.write_dataset`, the same flat layout), which writes
shards directly into its output folder, and this helper rearranges such flat outputs into the new
layout: it copies each run's shards and dead letters into `OUT/shards/<run>/`, rewrites the `file`
and `dead_letters_file` entries, adds `version`, `parent_version`, `committed_at` and `change`,
replaces `OUT/dataset_info.json` atomically (temp file, fsync, `os.replace`, as the writer's
commit does) and writes the `versions/<8 digits>.json` history copy.

This is NOT the writer (beam_jobs/writing/commit.py is): it has no lock, no precondition, and no
retention; it only produces the on-disk format the reader must read. Flat outputs are copied,
not moved, so one job run can seed many datasets.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tests.conftest import IN_PROCESS
from tests.dataset_files import as_older_release

__all__ = [
    "MANIFEST",
    "commit_append",
    "commit_overwrite",
    "examples_of",
    "manifest_of",
    "run_conversion",
    "run_name",
    "to_versioned",
]

MANIFEST = "dataset_info.json"
_REPO = pathlib.Path(__file__).resolve().parents[2]


def run_name(number: int) -> str:
    """A run name as the writer makes them (`YYYYMMDDTHHMMSSZ-<8 hex>`), fixed by `number`."""
    return f"20261201T13{number:02d}00Z-{hashlib.sha256(str(number).encode()).hexdigest()[:8]}"


def run_conversion(
    photos: pathlib.Path,
    out: pathlib.Path,
    *,
    image_size: str = "32x32",
    num_shards: int = 4,
    splits: str = "train=0.8,validation=0.2",
) -> pathlib.Path:
    """Runs the current conversion job (`python -m beam_jobs`) once, in a fresh process; returns `out`.

    Its output is rearranged into the flat layout (shards beside dataset_info.json): a dataset of
    version 1 as written before versioning, and the input of `to_versioned` / `commit_append`.
    """
    env = dict(os.environ)
    # Beam's worker processes find the venv's python first on PATH; the job imports this checkout.
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(_REPO)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(photos),
            "--output_dir",
            str(out),
            "--image_size",
            image_size,
            "--num_shards",
            str(num_shards),
            "--splits",
            splits,
            *IN_PROCESS,
        ],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"the conversion job failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-4000:]}"
        )
    return as_older_release(out)


def manifest_of(out: str | os.PathLike[str], version: int | None = None) -> dict[str, Any]:
    """The manifest of `version` as the format stores it (None: the root file), read with json only."""
    out = pathlib.Path(out)
    root = json.loads((out / MANIFEST).read_text())
    if version is None or root.get("version", 1) == version:
        return root
    return json.loads((out / "versions" / f"{version:08d}.json").read_text())


def examples_of(out: str | os.PathLike[str], split: str, version: int | None = None) -> list[tuple[str, int]]:
    """(image/key/sha256, image/class/label) of every record `version` lists for `split`, read
    straight from its shard files with TFRecordDataset (no reader code)."""
    pairs = []
    for shard in manifest_of(out, version)["splits"][split]["shards"]:
        for record in tf.data.TFRecordDataset(str(pathlib.Path(out) / shard["file"])):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            pairs.append(
                (
                    feature["image/key/sha256"].bytes_list.value[0].decode(),
                    feature["image/class/label"].int64_list.value[0],
                )
            )
    return pairs


def _copy_run(flat: pathlib.Path, out: pathlib.Path, run: str) -> dict[str, Any]:
    """Copies a flat output's shards and dead letters into OUT/shards/<run>/; its manifest, with
    the `file` and `dead_letters_file` entries rewritten to those relative paths."""
    manifest = json.loads((flat / MANIFEST).read_text())
    folder = out / "shards" / run
    folder.mkdir(parents=True, exist_ok=False)  # a run writes only in its own, new folder
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            shutil.copy2(flat / shard["file"], folder / shard["file"])
            shard["file"] = f"shards/{run}/{shard['file']}"
    dead = manifest.get("dead_letters_file", "dead_letters.jsonl")
    shutil.copy2(flat / dead, folder / "dead_letters.jsonl")
    manifest["dead_letters_file"] = f"shards/{run}/dead_letters.jsonl"
    return manifest


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, os.replace, fsync the folder: readers see old or new, whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _commit(
    out: pathlib.Path, manifest: dict[str, Any], change: dict[str, Any], *, history_copy: bool
) -> dict[str, Any]:
    """Commits `manifest` as the next version of OUT, as beam_jobs/writing/commit.py's format says.

    `history_copy=False` leaves out the new version's versions/N.json, as a kill right after the
    commit would (the root file is authoritative for the current version).
    """
    root = out / MANIFEST
    parent = json.loads(root.read_bytes()) if root.exists() else None
    parent_version = parent.get("version", 1) if parent else None
    (out / "versions").mkdir(exist_ok=True)
    if parent is not None:
        parent_copy = out / "versions" / f"{parent_version:08d}.json"
        if not parent_copy.exists():  # a parent written before versioning, or a kill before its copy
            _write_atomically(parent_copy, root.read_bytes())
    manifest = dict(manifest)
    manifest.update(
        version=(parent_version or 0) + 1,
        parent_version=parent_version,
        committed_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        change=change,
    )
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    _write_atomically(root, data)
    if history_copy:
        _write_atomically(out / "versions" / f"{manifest['version']:08d}.json", data)
    return manifest


def to_versioned(flat: str | os.PathLike[str], out: str | os.PathLike[str], *, run: str) -> dict[str, Any]:
    """Version 1 of a new dataset OUT (`change.kind` "create"), from one flat output; returns its manifest."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists():
        raise ValueError(f"test helper: {out} already holds a dataset")
    manifest = _copy_run(pathlib.Path(flat), out, run)
    return _commit(out, manifest, {"kind": "create", "run": run}, history_copy=True)


def commit_append(
    out: str | os.PathLike[str], flat: str | os.PathLike[str], *, run: str, history_copy: bool = True
) -> dict[str, Any]:
    """The next version of OUT: its current shards plus `flat`'s (`change.kind` "append"); returns its manifest.

    OUT may be versioned or flat (written before versioning: its root-level shards stay listed).
    Both must share label_names and image, as an append run checks.
    """
    out = pathlib.Path(out)
    current = json.loads((out / MANIFEST).read_text())
    added = _copy_run(pathlib.Path(flat), out, run)
    for key in ("label_names", "image"):
        if current[key] != added[key]:
            raise ValueError(f"test helper: cannot append {flat} to {out}: {key} differ")
    manifest = copy.deepcopy(current)
    for key in ("version", "parent_version", "committed_at", "change"):
        manifest.pop(key, None)
    counts: dict[str, int] = {}
    for name, split in added["splits"].items():
        mine = manifest["splits"].setdefault(name, {"num_examples": 0, "shards": [], "class_counts": {}})
        mine["shards"] = mine["shards"] + split["shards"]
        mine["num_examples"] += split["num_examples"]
        mine["num_shards"] = len(mine["shards"])
        if "class_counts" in mine and "class_counts" in split:
            mine["class_counts"] = _add_counts(mine["class_counts"], split["class_counts"])
        else:
            mine.pop("class_counts", None)
        counts[name] = split["num_examples"]
    manifest["dead_letters_file"] = added["dead_letters_file"]
    manifest["num_dead_letters"] = added.get("num_dead_letters", 0)
    return _commit(out, manifest, {"kind": "append", "run": run, "added": counts}, history_copy=history_copy)


def commit_overwrite(
    out: str | os.PathLike[str], flat: str | os.PathLike[str], *, run: str, history_copy: bool = True
) -> dict[str, Any]:
    """The next version of OUT: only `flat`'s shards (`change.kind` "overwrite"); returns its manifest.

    The parent's files stay where they are, as the writer keeps them for its retention window.
    """
    out = pathlib.Path(out)
    manifest = _copy_run(pathlib.Path(flat), out, run)
    return _commit(out, manifest, {"kind": "overwrite", "run": run}, history_copy=history_copy)


def _add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {name: a.get(name, 0) + b.get(name, 0) for name in sorted(set(a) | set(b))}

"""Where a run writes: its own folder, ``OUT/shards/<run>/``, that no other run and no commit touches.

Every file a run writes that a reader will use (shards, their sidecars, the run's dead letters)
goes into a folder named after the run and never used again: the names of a committed version's
files are therefore never written over, and the commit is only the manifest's write (commit.py).
A run name sorts by the time the run started (UTC), so ``ls OUT/shards`` reads as a history.

Folders that no manifest lists are uncommitted: a run still going, or a killed or refused one,
whose complete shards ``--resume`` may reuse (same fingerprint), and which the garbage
collection after a newer commit removes.

A run records its settings in its folder before any work (``.run.json``, `write_run_settings`),
so that what an interrupted run was making never depends on when it was interrupted: a run
killed before its first shard's sidecar was written is still known by its settings to the next
``--resume`` (which takes its resampling from the newest interrupted run). The commit removes
the record: a committed folder holds its shards, their sidecars and its dead letters.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import uuid
from collections.abc import Iterable

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.imaging.resample import RESAMPLE_METHODS
from beam_jobs.storage import delete_exactly, list_folder, list_tree, write_atomically

__all__ = [
    "RUN_NAME",
    "RUN_SETTINGS_FILE",
    "SHARDS_DIR",
    "forget_run_settings",
    "is_run_name",
    "listed_runs",
    "new_run_name",
    "resumable_runs",
    "run_dir",
    "run_of",
    "run_prefix",
    "run_folders",
    "resume_key",
    "run_made_for",
    "run_settings",
    "sidecar_name",
    "write_run_settings",
]

SHARDS_DIR = "shards"
# "20261201T133000Z-3fa2c1d0": the UTC start, then 8 random hex digits so that two runs started in
# the same second (on two machines) never share a folder.
RUN_NAME = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")
# A sidecar of a shard in a run folder (sidecar_name); not a converting shard's progress note
# (shard_progress.progress_note_name: ".progress-<run>-<shard>.json"), which holds no settings.
_SIDECAR = re.compile(rf"^\.(?!progress-{RUN_NAME.pattern.strip('^$')}-).+\.tfrecord\.json$")


# A run's settings, written at its start (write_run_settings); hidden, and no shard's sidecar.
RUN_SETTINGS_FILE = ".run.json"


def sidecar_name(file_name: str) -> str:
    """The hidden record beside a shard in its run folder: the shard's sources with their state,
    its content keys and dead letters. --resume trusts a shard by it without redoing it, and
    --append reads it to know which inputs a version already holds, so it is kept after the commit.
    """
    return f".{file_name}.json"


def new_run_name(now: datetime.datetime | None = None) -> str:
    """A fresh run name: sortable by start time, unique without coordination."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now.astimezone(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def is_run_name(name: str) -> bool:
    """Whether a folder under shards/ is a run's (as new_run_name makes them), and not someone else's."""
    return bool(RUN_NAME.match(name))


def run_prefix(run: str) -> str:
    """The run folder relative to the output folder, as manifests name their files: ``shards/<run>``."""
    return f"{SHARDS_DIR}/{run}"


def run_dir(output_dir: str, run: str) -> str:
    """The run's own folder, ``<output_dir>/shards/<run>``: where its shards are staged and stay once committed."""
    return FileSystems.join(output_dir, SHARDS_DIR, run)


def run_of(relative_file: str) -> str | None:
    """The run folder a manifest's ``file`` entry lies in ("shards/<run>/x" -> "<run>"), or None
    for the files of a dataset written by an older release, directly in the output folder. Pure."""
    parts = relative_file.split("/")
    if len(parts) == 3 and parts[0] == SHARDS_DIR and is_run_name(parts[1]):
        return parts[1]
    return None


def listed_runs(manifests: Iterable[dict]) -> set[str]:
    """The run folders that these manifests list shards (or dead letters) in. Pure."""
    runs: set[str] = set()
    for manifest in manifests:
        files = [
            shard.get("file", "")
            for split in (manifest.get("splits") or {}).values()
            for shard in split.get("shards", [])
        ]
        files.append(manifest.get("dead_letters_file") or "")
        runs.update(run for run in map(run_of, files) if run)
    return runs


def run_folders(output_dir: str) -> list[str]:
    """The run folders under ``OUT/shards/``, oldest first (names sort by start time)."""
    root = FileSystems.join(output_dir, SHARDS_DIR)
    runs = set()
    try:
        for meta in list_tree(root):
            relative = meta.path[len(root) :].lstrip("/")
            name = relative.split("/", 1)[0]
            if is_run_name(name):
                runs.add(name)
    except (OSError, ValueError):  # No shards/ folder yet.
        return []
    return sorted(runs)


def _read_json(path: str) -> dict | None:
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data = json.loads(handle.read().decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def run_made_for(append_to: int | None) -> str:
    """What a run's shards are for, as its sidecars record it: "" for every input (a new dataset or
    an overwrite), "append_to:N" for the inputs an append found missing from version N."""
    return "" if append_to is None else f"append_to:{append_to}"


def resume_key(fingerprint: str, made_for: str) -> str:
    """What --resume compares: the settings' fingerprint and, for an append, what it appends to."""
    return f"{fingerprint}|{made_for}" if made_for else fingerprint


def run_fingerprints(output_dir: str, run: str) -> dict[str | None, dict]:
    """The run fingerprints the sidecars of a run folder record, each joined with what the run was
    made for (`resume_key`; None for a sidecar without one), each with the preprocessing settings
    recorded beside it (to say what differs)."""
    folder = run_dir(output_dir, run)
    found: dict[str | None, dict] = {}
    for meta in list_folder(folder):
        if _SIDECAR.match(meta.path.rsplit("/", 1)[-1]):
            sidecar = _read_json(meta.path)
            if sidecar is not None:
                fingerprint = sidecar.get("run_fingerprint")
                key = None if fingerprint is None else resume_key(fingerprint, sidecar.get("made_for") or "")
                found.setdefault(key, sidecar.get("preprocessing") or {})
    return found


def write_run_settings(output_dir: str, run: str, preprocessing: dict) -> None:
    """Records in the run's folder, before any work, the settings it converts with (as its
    sidecars record them): see the module docstring."""
    data = json.dumps({"preprocessing": preprocessing}, sort_keys=True).encode("utf-8")
    write_atomically(FileSystems.join(run_dir(output_dir, run), RUN_SETTINGS_FILE), data)


def forget_run_settings(output_dir: str, run: str) -> None:
    """Deletes a run's settings record, if it has one: for a run that is over (committed, or an
    append that found nothing). Best effort: a record left behind goes with its folder's gc."""
    path = FileSystems.join(run_dir(output_dir, run), RUN_SETTINGS_FILE)
    with contextlib.suppress(Exception):
        if any(meta.path == path for meta in list_folder(run_dir(output_dir, run))):
            delete_exactly([path])


def run_settings(output_dir: str, run: str) -> dict | None:
    """The settings a run folder's record names (write_run_settings), or None for a folder
    without one (a release's before the record). Raises ValueError, saying why, for a record that
    is there but cannot be used: unreadable, not JSON, not settings, or naming a resampling that
    does not exist."""
    path = FileSystems.join(run_dir(output_dir, run), RUN_SETTINGS_FILE)
    if not any(meta.path == path for meta in list_folder(run_dir(output_dir, run))):
        return None
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            record = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{type(error).__name__}: {error}"[:200]) from None
    settings = record.get("preprocessing") if isinstance(record, dict) else None
    if not isinstance(settings, dict) or settings.get("resample") not in RESAMPLE_METHODS:
        raise ValueError("it names no settings this job makes (preprocessing.resample)")
    return settings


def resumable_runs(output_dir: str, committed: set[str]) -> list[tuple[str, dict[str | None, dict]]]:
    """The uncommitted run folders, newest first, each with the fingerprints its sidecars record:
    --resume continues the newest whose shards were made with the same settings."""
    return [
        (run, run_fingerprints(output_dir, run)) for run in reversed(run_folders(output_dir)) if run not in committed
    ]

"""Collecting garbage: deleting the files only versions outside the retention window list, and
killed runs' leftovers. ``garbage`` decides (pure); ``collect_garbage`` deletes under the run lock.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_jobs.storage import delete_exactly
from beam_jobs.versions.manifests import _shard_sizes, listed_files
from beam_jobs.versions.reading import _check_keep, _existing, _read_history_file, history
from beam_jobs.writing.commit import (
    VERSIONS_DIR,
)
from beam_jobs.writing.run_folders import SHARDS_DIR, run_of
from beam_jobs.writing.run_lock import acquire_output_lock, release_output_lock

DEFAULT_KEEP = 2


# What a run writes into its folder (run_folders.py): shards, their sidecars, its dead letters and
# their parts, its progress file, its settings' record, and temp files. gc removes nothing else
# from a run folder.
_RUN_FILE = re.compile(
    r"^(?:[^/]+-\d{5}-of-\d{5}\.tfrecord|\.[^/]+-\d{5}-of-\d{5}\.tfrecord\.json|dead_letters\.jsonl"
    r"|\.staged-dead_letters-\d{5}-of-\d{5}\.jsonl|\.progress-[^/]+\.json|\.tmp-[0-9a-f]{32}-[^/]+"
    r"|\.run\.json)$"
)


def _run_of(relative: str) -> str | None:
    """The run folder of a file a run of this job writes (shards/<run>/<one of its names>), or
    None: a folder under shards/ not named like a run, a file not named like a run's, or anything
    deeper, is the user's, and gc never removes it."""
    run = run_of(relative)
    return run if run is not None and _RUN_FILE.match(posixpath.basename(relative)) else None


def garbage(
    chain: Sequence[dict],
    others: Iterable[dict],
    existing: dict[str, int],
    keep: int,
    *,
    protected_runs: Iterable[str] = (),
) -> list[str]:
    """What gc deletes, relative to OUT. Pure.

    ``chain`` is the history, newest first; ``others`` any other manifest of ours (versions/ files
    off the chain); ``existing`` {relative path: size} of the files now in OUT. Deleted: files a
    version outside the window lists and no kept version does (a shard outside shards/ only when
    its size is still the manifest's: a file of the user's that took the name since is left), and
    every file of a run folder under shards/ that no kept version lists (a killed run's leftovers),
    except the folders in ``protected_runs``. Nothing else: not versions/, not the lock files, not
    a user's file.
    """
    kept = list(chain[:keep])
    keep_files = set().union(*(listed_files(m) for m in kept)) if kept else set()
    kept_runs = {run for f in keep_files if (run := _run_of(f))} | set(protected_runs)
    doomed = set()
    for manifest in [*chain[keep:], *others]:
        sizes = _shard_sizes(manifest)
        for name in listed_files(manifest) - keep_files:
            if name not in existing:
                continue
            if name in sizes and _run_of(name) is None and sizes[name] not in (None, existing[name]):
                continue
            doomed.add(name)
    for name in existing:
        run = _run_of(name)
        if run is not None and run not in kept_runs:
            doomed.add(name)
    return sorted(doomed)


def _off_chain_manifests(output_dir: str, chain: Sequence[dict], existing: dict[str, int]) -> list[dict]:
    """History manifests in versions/ that the walk from the root did not reach."""
    on_chain = {m["version"] for m in chain}
    others = []
    for name in existing:
        folder, _, file = name.partition("/")
        if folder == VERSIONS_DIR and file.endswith(".json") and file[:-5].isdigit() and len(file) == 13:
            version = int(file[:-5])
            if version not in on_chain and (manifest := _read_history_file(output_dir, version)):
                others.append(manifest)
    return others


def collect_garbage(output_dir: str, *, keep: int = DEFAULT_KEEP, holding_run: str | None = None) -> list[str]:
    """Deletes what no version in the retention window lists (see ``garbage``); returns the paths
    deleted, relative to OUT.

    Holds the folder's run lock throughout, so no conversion writes a run folder meanwhile (a
    running one makes this raise OutputLockedError with the lock's message). A run that holds the
    lock itself and collects after its own commit passes its name as ``holding_run``: the lock is
    then not taken again (nor released), and shards/<holding_run>/ is never touched.
    """
    _check_keep(keep)
    lock = None if holding_run else acquire_output_lock(output_dir)
    try:
        chain = history(output_dir)
        existing = _existing(output_dir)
        doomed = garbage(
            chain,
            _off_chain_manifests(output_dir, chain, existing),
            existing,
            keep,
            protected_runs=[holding_run] if holding_run else [],
        )
        delete_exactly([FileSystems.join(output_dir, name) for name in doomed])
        if "://" not in output_dir:
            _remove_empty_run_folders(output_dir)
        return doomed
    finally:
        if lock is not None:
            release_output_lock(lock)


def _remove_empty_run_folders(output_dir: str) -> None:
    shards = os.path.join(output_dir, SHARDS_DIR)
    if not os.path.isdir(shards):
        return
    for folder, _, _ in sorted(os.walk(shards), key=lambda entry: -len(entry[0])):
        if folder != shards:
            try:
                os.rmdir(folder)
            except OSError:  # Not empty: something is still kept, or a file of the user's.
                pass

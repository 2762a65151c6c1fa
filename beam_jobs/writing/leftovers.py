"""The job's own files in an output folder, known by their names, and the leftovers of killed
writers and earlier releases that a committed run removes from its top level."""

from __future__ import annotations

import re

from beam_jobs.storage import delete_exactly, list_folder
from beam_jobs.writing.commit import DATASET_INFO
from beam_jobs.writing.dead_letter_files import DEAD_LETTERS_FILE, REFUSED_DEAD_LETTERS_FILE
from beam_jobs.writing.plan_report import PLAN_DEAD_LETTERS_FILE, PLAN_FILE, is_own_plan
from beam_jobs.writing.shard_progress import progress_file_name

__all__ = ["is_dataset_file", "is_shard_or_sidecar", "is_writer_litter", "remove_root_leftovers"]

_SHARD_FILE = re.compile(r"^(?P<split>.+)-\d{5}-of-\d{5}\.tfrecord$")
_PROGRESS_FILE = re.compile(r"^\.progress-.+\.json$")  # see shard_progress.progress_file_name
_SHARD_NOTE = re.compile(r"^\.progress-.+\.tfrecord\.json$")  # see shard_progress.progress_note_name


def is_dataset_file(name: str) -> bool:
    """True for the names this job writes into an output folder (shards, their hidden staged and
    temporary forms, the two JSON files)."""
    return (
        bool(_SHARD_FILE.match(name))
        or name in (DATASET_INFO, DEAD_LETTERS_FILE, REFUSED_DEAD_LETTERS_FILE)
        or name.startswith((".staged-", ".tmp-"))
    )


def is_shard_or_sidecar(name: str) -> bool:
    """True for a shard's name, and for its sidecar's (the hidden name with ``.json``)."""
    return bool(_SHARD_FILE.match(name) or (name.startswith(".") and _SHARD_FILE.match(name[1:].removesuffix(".json"))))


def is_writer_litter(name: str) -> bool:
    """True for what a dead writer leaves in a run's folder: a temporary file, or a shard's
    progress note (shard_progress.py)."""
    return name.startswith(".tmp-") or bool(_SHARD_NOTE.match(name))


def remove_root_leftovers(output_dir: str, *, run_id: str | None = None) -> list[str]:
    """Deletes, after a commit, what the output folder's top level must not keep; returns the names.

    That is: temp files of killed writers (this run holds the lock, so no writer is alive); the
    hidden staged files, sidecars and dead-letter parts that releases before versioned datasets
    left in the top level; their refused-run dead letters; the files of an earlier --plan_only,
    which no longer describe what is there (only the job's own plan: plan.json is a common name);
    and the progress files of other runs. Nothing a manifest lists lives here any more (shards sit
    in run folders, which the garbage collection handles), and a file of the user's, even one
    named like a shard, is never touched.
    """
    own_progress = None if run_id is None else progress_file_name(run_id)
    listing = {meta.path.rsplit("/", 1)[-1]: meta.path for meta in list_folder(output_dir)}
    plan_files = (
        (PLAN_FILE, PLAN_DEAD_LETTERS_FILE) if PLAN_FILE not in listing or is_own_plan(listing[PLAN_FILE]) else ()
    )
    doomed = [
        path
        for name, path in listing.items()
        if name.startswith((".tmp-", ".staged-"))
        or name == REFUSED_DEAD_LETTERS_FILE
        or name in plan_files
        or (_PROGRESS_FILE.match(name) and name != own_progress)
    ]
    delete_exactly(doomed)
    return sorted(path.rsplit("/", 1)[-1] for path in doomed)

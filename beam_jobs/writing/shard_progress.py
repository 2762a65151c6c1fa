"""A shard's count of images done while it converts, left in the run folder for the launching process.

A finished shard is seen by its sidecar (convert_shards.py); a shard of thousands of images takes
minutes, and a run of a few shards would otherwise show progress in a few jumps. So a worker
converting a shard rewrites a tiny note, ``.progress-<run id>-<shard file>.json`` holding
``{"images": n}``, at most once per interval, and deletes it once the sidecar is written. The
launching process's watcher (command_line/progress.py) adds the notes of shards without a sidecar
to the images of finished ones. Notes are files, not Beam metrics, because no runner reports
metrics to the launcher before the job ends, and every runner's workers can write the output folder.

Best effort throughout: a note that cannot be written or deleted costs the display a moment of
accuracy, never the shard; a killed worker's note is rewritten by the retry of its shard, and
removed with the run's other leftovers after the commit (finalize.py) or by an interrupt's clean-up.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from beam_jobs.storage import delete_exactly, write_atomically

__all__ = [
    "ShardProgressNote",
    "progress_file_name",
    "progress_note_name",
    "progress_note_prefix",
    "write_progress_plan",
]

_LOG = logging.getLogger(__name__)

# How often a converting shard's note is rewritten: often enough that a line or bar moves every
# second or so on local disk; on an object store each write is a request, so less often there.
LOCAL_INTERVAL_S = 1.0
REMOTE_INTERVAL_S = 5.0


def progress_file_name(run_id: str) -> str:
    """Hidden and unique to one run, so a watcher never reads the plan of another (killed) run."""
    return f".progress-{run_id}.json"


def write_progress_plan(output_dir: str, run_id: str, *, line: str, summary: dict) -> None:
    """Called by the plan step: what the watcher needs to know the totals, and the plan's line."""
    plan = {
        "line": line,
        "splits": {
            name: {"num_examples": s["num_examples"], "num_shards": s["num_shards"]}
            for name, s in summary["splits"].items()
        },
    }
    write_atomically(
        FileSystems.join(output_dir, progress_file_name(run_id)), json.dumps(plan, sort_keys=True).encode("utf-8")
    )


def progress_note_prefix(run_id: str) -> str:
    """What the names of one run's shard notes start with; the run's plan file is ``.progress-<run id>.json``."""
    return f".progress-{run_id}-"


def progress_note_name(run_id: str, file_name: str) -> str:
    """The note of shard ``file_name`` of run ``run_id``: hidden, and unique to the run and the shard."""
    return f"{progress_note_prefix(run_id)}{file_name}.json"


class ShardProgressNote:
    """Rewrites one shard's note as its images are done, at most once per interval; see the module docstring."""

    def __init__(
        self,
        folder: str,
        run_id: str,
        file_name: str,
        *,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = FileSystems.join(folder, progress_note_name(run_id, file_name))
        remote = "://" in folder
        self._interval_s = interval_s if interval_s is not None else REMOTE_INTERVAL_S if remote else LOCAL_INTERVAL_S
        self._clock = clock
        self._last = clock()  # the first note after one interval: a shard done sooner needs none
        self._written = False

    def count(self, images: int) -> None:
        """Records that ``images`` of the shard's inputs are done (converted or dead-lettered), if a note is due."""
        now = self._clock()
        if now - self._last < self._interval_s:
            return
        self._last = now
        try:
            write_atomically(self._path, json.dumps({"images": images}).encode("utf-8"))
            self._written = True
        except Exception as error:  # Only the display would miss it.
            _LOG.debug("could not write the progress note %s: %s", self._path, error)

    def remove(self) -> None:
        """Deletes the note once the shard's sidecar counts its images (or the shard failed)."""
        if not self._written:
            return
        try:
            delete_exactly([self._path])
            self._written = False
        except Exception as error:  # A hidden file of a few bytes, removed after the commit anyway.
            _LOG.debug("could not delete the progress note %s: %s", self._path, error)

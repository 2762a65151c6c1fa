"""Progress of a running job, seen from the launching process by watching the output folder.

The local runner converts in worker processes, and cluster runners on other machines; neither
reports metrics to the launching process until the job ends. What every runner does leave, as
each shard completes, is a staged shard and its sidecar in ``--output_dir`` (see convert.py),
and the plan step writes a small progress file there before any shard is converted. Listing that
folder therefore tells shards and images done, on any runner whose output folder the launching
machine can read, at the cost of one listing every few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.storage import delete_exactly, list_folder, write_atomically

__all__ = ["Progress", "StagingWatcher", "progress_file_name", "tally", "write_progress_plan"]

# A sidecar of a staged shard: ".staged-<split>-SSSSS-of-NNNNN.tfrecord.json".
_SIDECAR = re.compile(r"^\.staged-(?P<split>.+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.tfrecord\.json$")


def progress_file_name(run_id: str) -> str:
    """Hidden and unique to one run, so a watcher never reads the plan of another (killed) run."""
    return f".progress-{run_id}.json"


def write_progress_plan(output_dir: str, run_id: str, *, line: str, summary: dict) -> None:
    """Called by the plan step: what the watcher needs to know the totals, and the plan's line."""
    plan = {"line": line, "splits": {name: {"num_examples": s["num_examples"], "num_shards": s["num_shards"]}
                                     for name, s in summary["splits"].items()}}
    write_atomically(FileSystems.join(output_dir, progress_file_name(run_id)),
                     json.dumps(plan, sort_keys=True).encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class Progress:
    """Shards and images done of the plan's totals (images: inputs converted or dead-lettered)."""

    shards_done: int
    shards_total: int
    images_done: int
    images_total: int

    @property
    def fraction(self) -> float:
        if self.images_total:
            return min(1.0, self.images_done / self.images_total)
        return self.shards_done / self.shards_total if self.shards_total else 0.0


def tally(plan: dict, staged: dict[str, int]) -> Progress:
    """Progress from the plan's splits and ``{sidecar name: inputs it accounts for}``.

    Pure. Sidecars of another plan (another split, or another shard count left by an earlier
    run) are not counted.
    """
    splits = plan["splits"]
    shards = images = 0
    for name, inputs in staged.items():
        match = _SIDECAR.match(name)
        if match and match["split"] in splits and int(match["total"]) == splits[match["split"]]["num_shards"]:
            shards += 1
            images += inputs
    return Progress(shards_done=shards, shards_total=sum(s["num_shards"] for s in splits.values()),
                    images_done=images, images_total=sum(s["num_examples"] for s in splits.values()))


def _read_json(path: str) -> dict | None:
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return json.loads(handle.read().decode("utf-8"))
    except Exception:  # Gone (finalize removes sidecars) or unreadable: the next poll sees the truth.
        return None


class StagingWatcher:
    """Polls ``output_dir`` on a thread and reports the plan once, then each change of progress.

    ``on_plan(line, progress)`` is called once the plan step has written its progress file;
    ``on_progress(progress)`` whenever a new shard is staged. Sidecars already there when the run
    started count only with ``resume`` (their shards are verified and kept); otherwise they are
    an earlier run's, about to be rewritten, and a sidecar counts once it is newer than the start.
    Watching is best effort: a folder that cannot be listed leaves the run without progress, and
    never fails it.
    """

    def __init__(self, output_dir: str, run_id: str, *, on_plan: Callable[[str, Progress], None],
                 on_progress: Callable[[Progress], None], resume: bool = False, interval_s: float = 0.5) -> None:
        self._output_dir = output_dir
        self._progress_path = FileSystems.join(output_dir, progress_file_name(run_id))
        self._on_plan = on_plan
        self._on_progress = on_progress
        self._resume = resume
        self._interval_s = interval_s if "://" not in output_dir else max(interval_s, 5.0)
        self._started = time.time()
        self._plan: dict | None = None
        self._staged: dict[str, int] = {}  # sidecar name -> inputs it accounts for; kept once seen
        self._last: Progress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="staging-watcher", daemon=True)

    @property
    def plan(self) -> dict | None:
        return self._plan

    def start(self) -> StagingWatcher:
        self._thread.start()
        return self

    def stop(self, *, succeeded: bool = False) -> None:
        """Stops polling after one last look, so a short run still reports its plan; a run that
        succeeded converted every planned shard, whose sidecars finalize may have removed already."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()
        if succeeded and self._last is not None:
            done = Progress(shards_done=self._last.shards_total, shards_total=self._last.shards_total,
                            images_done=self._last.images_total, images_total=self._last.images_total)
            if done != self._last:
                self._last = done
                self._on_progress(done)

    def remove_progress_file(self) -> None:
        # delete_exactly: FileSystems.delete reads "[" or "*" in an output folder's name as a pattern.
        try:
            if FileSystems.exists(self._progress_path):
                delete_exactly([self._progress_path])
        except Exception:  # A hidden file of a few hundred bytes; never worth failing a run for.
            pass

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.poll()
            # A large remote folder takes a while to list: never spend more than a fifth of the time on it.
            self._stop.wait(max(self._interval_s, 5 * (time.monotonic() - began)))

    def poll(self) -> None:
        try:
            if self._plan is None:
                self._plan = _read_json(self._progress_path)
                if self._plan is None:
                    return
                self._scan()
                self._last = tally(self._plan, self._staged)
                self._on_plan(self._plan["line"], self._last)
                return
            self._scan()
            progress = tally(self._plan, self._staged)
            if progress != self._last:
                self._last = progress
                self._on_progress(progress)
        except Exception:  # Best effort, see the class docstring.
            return

    def _scan(self) -> None:
        for meta in list_folder(self._output_dir):
            name = meta.path.rsplit("/", 1)[-1]
            if name in self._staged or not _SIDECAR.match(name):
                continue
            if not self._resume and (meta.last_updated_in_seconds or 0) < self._started - 1:
                continue
            sidecar = _read_json(meta.path)
            if sidecar is not None:
                self._staged[name] = int(sidecar.get("num_examples", 0)) + len(sidecar.get("dead_letters", []))

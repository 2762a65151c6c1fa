"""Progress of a running job, seen from the launching process by watching the output folder.

The local runner converts in worker processes, and cluster runners on other machines; neither
reports metrics to the launching process until the job ends. What every runner does leave, as
each shard completes, is the shard and its sidecar in the run's folder (see convert_shards.py);
while a shard converts, its worker rewrites a tiny note of the images done (shard_progress.py);
and the plan step writes a small progress file there before any shard is converted. Listing the
folder therefore tells shards and images done, on any runner whose output folder the launching
machine can read, at the cost of one listing every few seconds.

A sidecar counts only when it names this run's id: convert_shards.py writes the id into every sidecar it
writes, and rewrites the sidecar of a shard it keeps under --resume (with ``kept`` set). The id,
not a modification time, decides, because a shard left by an earlier run may be kept or redone,
which no time and no plan-time listing can tell, and because the clocks of the launching machine
and of a remote store need not agree.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.storage import delete_exactly, list_folder
from beam_jobs.writing.shard_progress import progress_file_name, progress_note_prefix, write_progress_plan

__all__ = ["Progress", "StagingWatcher", "progress_file_name", "tally", "write_progress_plan"]

# A shard's sidecar in its run folder: ".<split>-SSSSS-of-NNNNN.tfrecord.json" (convert.sidecar_name).
_SIDECAR = re.compile(r"^\.(?P<split>.+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.tfrecord\.json$")


@dataclasses.dataclass(frozen=True)
class Progress:
    """Shards and images done of the plan's totals (images: inputs converted or dead-lettered)."""

    shards_done: int
    shards_total: int
    images_done: int
    images_total: int
    images_kept: int = 0  # of images_done: in shards --resume kept from an earlier run (no work, no rate)

    @property
    def fraction(self) -> float:
        """How much of the run is done, from 0 to 1: by images where the plan has any, else by shards."""
        if self.images_total:
            return min(1.0, self.images_done / self.images_total)
        return self.shards_done / self.shards_total if self.shards_total else 0.0


def tally(
    plan: dict, staged: Mapping[str, int], kept: Collection[str] = (), converting: Mapping[str, int] | None = None
) -> Progress:
    """Progress from the plan's splits and ``{sidecar name: inputs it accounts for}`` (this run's
    sidecars only); ``kept`` names those of shards kept from an earlier run; ``converting`` gives
    ``{sidecar name: inputs done}`` for shards still converting (their notes, shard_progress.py).

    Pure. Sidecars of another plan (another split, or another shard count left by an earlier
    run) are not counted, and a shard's note not once its sidecar is.
    """
    splits = plan["splits"]

    def planned(name: str) -> bool:
        match = _SIDECAR.match(name)
        return (
            match is not None
            and match["split"] in splits
            and int(match["total"]) == splits[match["split"]]["num_shards"]
        )

    shards = images = images_kept = 0
    for name, inputs in staged.items():
        if planned(name):
            shards += 1
            images += inputs
            images_kept += inputs if name in kept else 0
    images += sum(done for name, done in (converting or {}).items() if name not in staged and planned(name))
    return Progress(
        shards_done=shards,
        shards_total=sum(s["num_shards"] for s in splits.values()),
        images_done=images,
        images_total=sum(s["num_examples"] for s in splits.values()),
        images_kept=images_kept,
    )


def _read_json(path: str) -> dict | None:
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return json.loads(handle.read().decode("utf-8"))
    except Exception:  # Gone (finalize removes sidecars) or unreadable: the next poll sees the truth.
        return None


class StagingWatcher:
    """Polls ``output_dir`` on a thread and reports the plan once, then each change of progress.

    ``on_plan(line, progress)`` is called once the plan step has written its progress file;
    ``on_progress(progress)`` after every later poll, changed or not (a display shows time passing
    too). Images count as they are converted: a shard's sidecar counts its inputs once it is staged
    or kept, and until then the note its worker rewrites (shard_progress.py) counts those done. A sidecar counts once it
    names ``run_id`` (see the module docstring): an earlier run's sidecar is about to be kept
    (and rewritten with this run's id) or replaced. Watching is best effort: a folder that cannot
    be listed leaves the run without progress, and never fails it.
    """

    def __init__(
        self,
        output_dir: str,
        run_id: str,
        *,
        on_plan: Callable[[str, Progress], None],
        on_progress: Callable[[Progress], None],
        interval_s: float = 0.5,
    ) -> None:
        self._output_dir = output_dir
        self._run_id = run_id
        self._progress_path = FileSystems.join(output_dir, progress_file_name(run_id))
        self._on_plan = on_plan
        self._on_progress = on_progress
        self._interval_s = interval_s if "://" not in output_dir else max(interval_s, 5.0)
        self._plan: dict | None = None
        self._staged: dict[str, int] = {}  # this run's sidecars -> inputs they account for; final once seen
        self._kept: set[str] = set()  # of those, the sidecars of shards kept from an earlier run
        self._note_prefix = progress_note_prefix(run_id)
        self._converting: dict[str, int] = {}  # shards being converted -> inputs done, from their notes
        self._others: dict[str, tuple] = {}  # other runs' sidecars -> (size, time) when read: reread on change
        self._last: Progress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="staging-watcher", daemon=True)

    @property
    def plan(self) -> dict | None:
        """The plan step's progress file once it has been read, None until then."""
        return self._plan

    def start(self) -> StagingWatcher:
        """Starts polling on the watcher's thread; returns the watcher, so that it can be built and started at once.
        Called before the pipeline runs: a progress file already there is a killed attempt's (--resume
        continues its run folder), whose plan and totals are not this attempt's, so it is removed."""
        self.remove_progress_file()
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
            done = dataclasses.replace(
                self._last, shards_done=self._last.shards_total, images_done=self._last.images_total
            )
            if done != self._last:
                self._last = done
                self._on_progress(done)

    def remove_progress_file(self) -> None:
        """Deletes the run's progress file once the run is over, so that no hidden file of it stays in the output."""
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
        """One look at the folder: reads the plan until it appears, then reports progress whenever it has changed."""
        try:
            if self._plan is None:
                self._plan = _read_json(self._progress_path)
                if self._plan is None:
                    return
                self._scan()
                self._last = tally(self._plan, self._staged, self._kept, self._converting)
                self._on_plan(self._plan["line"], self._last)
                return
            self._scan()
            # Every poll, changed or not: the display decides what to show, and its clock runs on.
            self._last = tally(self._plan, self._staged, self._kept, self._converting)
            self._on_progress(self._last)
        except Exception:  # Best effort, see the class docstring.
            return

    def _scan(self) -> None:
        converting: dict[str, int] = {}
        for meta in list_folder(self._output_dir):
            name = meta.path.rsplit("/", 1)[-1]
            if name.startswith(self._note_prefix) and name.endswith(".tfrecord.json"):
                shard = f".{name[len(self._note_prefix) :]}"  # the shard's sidecar name (convert_shards.sidecar_name)
                if shard not in self._staged and (note := _read_json(meta.path)) is not None:
                    converting[shard] = int(note.get("images", 0))
                continue
            if name in self._staged or not _SIDECAR.match(name):
                continue
            state = (meta.size_in_bytes, meta.last_updated_in_seconds)
            if self._others.get(name) == state and None not in state:
                continue  # Another run's, unchanged since it was read.
            sidecar = _read_json(meta.path)
            if sidecar is None:
                continue
            if sidecar.get("run_id") != self._run_id:
                self._others[name] = state
                continue
            self._others.pop(name, None)
            self._staged[name] = int(sidecar.get("num_examples", 0)) + len(sidecar.get("dead_letters", []))
            if sidecar.get("kept"):
                self._kept.add(name)
        self._converting = converting

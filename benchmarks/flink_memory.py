"""Memory of a job with --split_groups near_copies on a loopback Flink cluster, at two sizes: does
planning's memory stay flat as the dataset grows?

    python benchmarks/flink_memory.py [--sizes 2000,8000] [--collection tiles|sample] [--split_groups none]

For each size, a fresh cluster of 1 TaskManager x 2 slots (benchmarks/runners.py's), one job
submitted through launch/submit_flink.sh, and every 0.2 s the resident memory of the cluster's
processes, read with psutil: the TaskManager's JVM, the job server's JVM, and the Python SDK
workers (the worker pool's children, which run every stage: listing, signing, grouping, planning
and converting). The table has each one's peak, and the largest single SDK worker's, whose
growth is what planning adds per input (the band groups, the pairs, the groups' side input).

``tiles`` (the default) are distinct real photos with a few near-copies each (near_copies.py's
tile tree; the first N/4 photos with their copies); ``sample`` the sample photos, crops of nine
photographs, whose near pairs grow with the square of their number.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from near_copies import make_tile_tree  # noqa: E402
from runners import FlinkBenchCluster, _env, start_cluster, stop_cluster  # noqa: E402

from beam_jobs.sample_data import make_photo_tree  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB_FLAGS = ["--image_size", "224", "--splits", "train=0.9,validation=0.1"]


def _kind(process: psutil.Process) -> str | None:
    """Which part of the cluster a process is, by its command line (None: not the cluster's)."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return None
    if "TaskManagerRunner" in command:
        return "taskmanager"
    if "flink-job-server" in command or "FlinkJobServerDriver" in command:
        return "job server"
    if "sdk_worker" in command or "local_worker" in command or "sdk_worker_pool" in command:
        return "sdk worker"
    return None


class PeakMemory:
    """The peak resident memory of each kind of cluster process, sampled until stopped."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.largest_worker = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            totals: dict[str, int] = {}
            for process in psutil.process_iter():
                kind = _kind(process)
                try:
                    rss = process.memory_info().rss if kind else 0
                except psutil.Error:
                    continue
                if kind:
                    totals[kind] = totals.get(kind, 0) + rss
                    if kind == "sdk worker":
                        self.largest_worker = max(self.largest_worker, rss)
            for kind, total in totals.items():
                self.peaks[kind] = max(self.peaks.get(kind, 0), total)
            time.sleep(0.2)


def _tree(work: pathlib.Path, collection: str, size: int) -> pathlib.Path:
    images = work / f"{collection}-{size}"
    if not images.exists():
        if collection == "sample":
            make_photo_tree(images, num_images=size, size=(500, 375), seed=11)
        else:
            make_tile_tree(images, num_images=size)
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,8000")
    parser.add_argument("--collection", choices=("tiles", "sample"), default="tiles")
    parser.add_argument("--split_groups", choices=("near_copies", "none"), default="near_copies")
    args = parser.parse_args()
    flags = [*JOB_FLAGS, "--split_groups", args.split_groups]
    work = pathlib.Path(tempfile.mkdtemp(prefix="flink-memory-"))
    rows = []
    try:
        for size in (int(value) for value in args.sizes.split(",")):
            images = _tree(work, args.collection, size)
            cluster = FlinkBenchCluster(work / f"flink-{size}", 1)
            start_cluster(cluster)
            out = work / f"out-{size}"
            try:
                with PeakMemory() as memory:
                    start = time.perf_counter()
                    subprocess.run(
                        [*cluster.submit, "--input", str(images), "--output_dir", str(out), *flags],
                        env=_env(),
                        cwd=REPO_ROOT,
                        check=True,
                        capture_output=True,
                    )
                    seconds = time.perf_counter() - start
            finally:
                stop_cluster(cluster)
            rows.append((size, seconds, memory.peaks, memory.largest_worker))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = 1024 * 1024
    print(f"\n--split_groups {args.split_groups} on Flink, 1 TaskManager x 2 slots, {args.collection}\n")
    print("| photos | job s | TaskManager MiB | job server MiB | SDK workers MiB (all) | largest SDK worker MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, seconds, peaks, largest in rows:
        print(
            f"| {size:,} | {seconds:.1f} | {peaks.get('taskmanager', 0) / mib:.0f} | "
            f"{peaks.get('job server', 0) / mib:.0f} | {peaks.get('sdk worker', 0) / mib:.0f} | {largest / mib:.0f} |"
        )


if __name__ == "__main__":
    main()

"""Scale benchmark: planning millions of inputs with --plan_only, and converting tens of thousands.

    python benchmarks/scale.py [--sizes 250000,1000000,4000000] [--old_ref REF --old_sizes 100000,400000]
                               [--photos 8000,50000] [--work_dir DIR]

Each run is a whole `python -m beam_jobs` process on the default local runner. While it runs, its
process tree is sampled every 0.2 s (psutil): the peak RSS of the largest single process (an SDK
worker, or the runner itself), and of the whole tree. The input lists are synthetic: N rows over
1,000 classes whose files do not exist, which --plan_only never opens.

--old_ref runs an older commit of the job (which has no --plan_only) on the same lists: a full
run with --max_bad_fraction 1, where every row fails to read, so its figures are listing,
planning and finalizing, as close to a plan as that code gets.

--photos converts trees of N real photos (500x375 JPEGs cut from the photographs shipped with
scikit-image) to 224 px JPEG shards, to compare images/s and peak memory across sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
NUM_CLASSES = 1000


def write_input_list(path: pathlib.Path, rows: int) -> pathlib.Path:
    """N rows "cNNN/imgNNNNNNN.jpg,classNNN"; the files need not exist."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    with temp.open("w") as handle:
        handle.write("uri,label\n")
        for i in range(rows):
            label = i % NUM_CLASSES
            handle.write(f"c{label:03d}/img{i:08d}.jpg,class{label:03d}\n")
    temp.rename(path)
    return path


def measure(command: list[str], *, cwd: pathlib.Path, env: dict) -> dict:
    """Runs ``command``; returns wall seconds, exit code, peak RSS (MB) of the largest process and
    of the whole process tree, sampled every 0.2 s."""
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"largest": 0, "tree": 0, "runner": 0, "worker": 0}
    root = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            try:
                members = [root, *root.children(recursive=True)]
                sizes = []
                for member in members:
                    try:
                        rss = member.memory_info().rss
                    except psutil.Error:
                        continue
                    sizes.append(rss)
                    # The job's own process runs the local runner; its children are SDK workers.
                    key = "runner" if member.pid == proc.pid else "worker"
                    peaks[key] = max(peaks[key], rss)
                peaks["largest"] = max(peaks["largest"], max(sizes, default=0))
                peaks["tree"] = max(peaks["tree"], sum(sizes))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    return {
        "wall_s": time.monotonic() - started,
        "rc": proc.returncode,
        "largest_mb": peaks["largest"] / 2**20,
        "tree_mb": peaks["tree"] / 2**20,
        "runner_mb": peaks["runner"] / 2**20,
        "worker_mb": peaks["worker"] / 2**20,
        "stdout": stdout,
        "stderr": stderr,
    }


def _env(code_dir: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_dir)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def checkout(ref: str, into: pathlib.Path) -> pathlib.Path:
    """The job's code at ``ref``, unpacked (not checked out: the working tree stays as it is)."""
    if not into.exists():
        archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True).stdout
        into.mkdir(parents=True)
        with tempfile.TemporaryFile() as handle:
            handle.write(archive)
            handle.seek(0)
            tarfile.open(fileobj=handle).extractall(into)
    return into


def plan_rows(rows: int, work: pathlib.Path, *, code_dir: pathlib.Path, old: bool) -> dict:
    listing = write_input_list(work / f"lists/{rows}/list.csv", rows)
    out = work / f"out-{'old' if old else 'new'}-{rows}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    if old:
        args = ["--max_bad_fraction", "1", "--num_shards", "16"]
    else:
        args = ["--plan_only"]
    result = measure(
        [sys.executable, "-m", "beam_jobs", "--manifest", str(listing), "--output_dir", str(out), *args],
        cwd=code_dir,
        env=_env(code_dir),
    )
    if result["rc"] != 0:
        print(result["stderr"][-3000:], file=sys.stderr)
    elif not old:
        plan = json.loads((out / "plan.json").read_text())
        assert plan["num_inputs"] == rows, plan["num_inputs"]
    return result


# A bare GroupByKey on the local runner, with none of the job's code: how much of a worker's memory
# is the runner's own handling of a shuffle. FnApiRunner's GroupingBuffer.partition encodes each
# worker's whole share of a GroupByKey's output as one bytes object, sent as one data-plane
# message, so a worker's peak grows with (grouped data / workers): --gbk_probe_workers shows it.
_GBK_PROBE = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
path, workers = sys.argv[1], sys.argv[2]
options = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                           f"--direct_num_workers={workers}"])
with beam.Pipeline(options=options) as p:
    _ = (p | beam.Create([path]) | beam.Reshuffle()
         | "Lines" >> beam.FlatMap(lambda q: (line.split(",")[0] for line in open(q)))
         | "Key" >> beam.Map(lambda uri: (uri, uri)) | beam.GroupByKey() | "One" >> beam.Map(lambda kv: 1)
         | beam.combiners.Count.Globally())
"""


def gbk_probe(rows: int, work: pathlib.Path, workers: int = 0) -> dict:
    listing = write_input_list(work / f"lists/{rows}/list.csv", rows)
    return measure([sys.executable, "-c", _GBK_PROBE, str(listing), str(workers)], cwd=REPO, env=_env(REPO))


def _machine_peaks(stop: threading.Event, peaks: dict) -> None:
    """Peak RSS of SDK worker processes (started by a worker pool, outside the job's own process
    tree) and of Flink TaskManager JVMs, anywhere on this machine."""
    while not stop.is_set():
        for process in psutil.process_iter(["cmdline", "memory_info"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            rss = process.info["memory_info"].rss if process.info["memory_info"] else 0
            if "sdk_worker_main" in cmdline:
                peaks["worker"] = max(peaks["worker"], rss)
            elif "TaskManagerRunner" in cmdline:
                peaks["taskmanager"] = max(peaks["taskmanager"], rss)
        stop.wait(0.5)


def plan_rows_on_flink(sizes: list[int], work: pathlib.Path, *, tm_memory: str = "1024m") -> list[tuple[int, dict]]:
    """--plan_only through FlinkRunner on a loopback cluster of 2 TaskManagers of ``tm_memory``."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from runners import Cluster  # noqa: E402  (a sibling script)

    jar = (
        subprocess.run(
            [str(REPO / "launch" / "flink_cluster.sh"), "fetch"],
            env=_env(REPO),
            check=True,
            capture_output=True,
            text=True,
        )
        .stderr.split("job server jar: ")[1]
        .strip()
    )
    cluster = Cluster(work / "flink-scale", 2)
    cluster.args[cluster.args.index("--taskmanager_memory") + 1] = tm_memory
    results = []
    try:
        cluster.start()
        for rows in sizes:
            listing = write_input_list(work / f"lists/{rows}/list.csv", rows)
            out = work / f"out-flink-{rows}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            peaks = {"worker": 0, "taskmanager": 0}
            stop = threading.Event()
            sampler = threading.Thread(target=_machine_peaks, args=(stop, peaks), daemon=True)
            sampler.start()
            result = measure(
                [
                    str(REPO / "launch" / "submit_flink.sh"),
                    "--flink_master",
                    cluster.flink_master,
                    "--environment_config",
                    cluster.worker_pool,
                    "--parallelism",
                    "4",
                    "--flink_job_server_jar",
                    jar,
                    "--manifest",
                    str(listing),
                    "--output_dir",
                    str(out),
                    "--plan_only",
                ],
                cwd=REPO,
                env=_env(REPO),
            )
            stop.set()
            sampler.join()
            result["worker_mb"] = peaks["worker"] / 2**20
            result["taskmanager_mb"] = peaks["taskmanager"] / 2**20
            if result["rc"] != 0:
                print(result["stderr"][-3000:], file=sys.stderr)
            print(
                f"flink {rows}: {result['wall_s']:.1f} s, largest SDK worker {result['worker_mb']:.0f} MB, "
                f"TaskManager {result['taskmanager_mb']:.0f} MB, rc {result['rc']}",
                flush=True,
            )
            results.append((rows, result))
    finally:
        cluster.stop()
    return results


def convert_photos(count: int, work: pathlib.Path) -> dict:
    from beam_jobs.sample_data import make_photo_tree

    photos = work / f"photos-{count}"
    if not (photos / ".complete").exists():
        make_photo_tree(photos, num_images=count, size=(500, 375), seed=7)
        (photos / ".complete").write_text("")
    out = work / f"converted-{count}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    result = measure(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), "--image_size", "224"],
        cwd=REPO,
        env=_env(REPO),
    )
    result["images_per_s"] = count / result["wall_s"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250000,1000000,4000000")
    parser.add_argument("--old_ref", default=None, help="a commit of the job before cluster-scale planning")
    parser.add_argument("--old_sizes", default="100000,400000")
    parser.add_argument("--photos", default="", help="e.g. 8000,50000")
    parser.add_argument("--flink_sizes", default="", help="--plan_only on FlinkRunner, 2 TaskManagers")
    parser.add_argument("--flink_tm_memory", default="1024m", help="process size of each TaskManager")
    parser.add_argument("--gbk_probe", default="", help="rows of a bare Create -> GroupByKey on the local runner")
    parser.add_argument("--gbk_probe_workers", default="0", help="SDK worker counts for --gbk_probe (0: one per core)")
    parser.add_argument("--work_dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "itt-scale")
    args = parser.parse_args(argv)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    rows_out = []
    for rows in [int(s) for s in args.sizes.split(",") if s]:
        r = plan_rows(rows, work, code_dir=REPO, old=False)
        rows_out.append(("this job, --plan_only", rows, r))
        print(
            f"new {rows}: {r['wall_s']:.1f} s, runner {r['runner_mb']:.0f} MB, largest worker {r['worker_mb']:.0f} MB, "
            f"tree {r['tree_mb']:.0f} MB, rc {r['rc']}",
            flush=True,
        )
    if args.old_ref:
        old_dir = checkout(args.old_ref, work / f"code-{args.old_ref}")
        for rows in [int(s) for s in args.old_sizes.split(",") if s]:
            r = plan_rows(rows, work, code_dir=old_dir, old=True)
            rows_out.append((f"previous job ({args.old_ref}), full run of unreadable rows", rows, r))
            print(
                f"old {rows}: {r['wall_s']:.1f} s, runner {r['runner_mb']:.0f} MB, largest worker "
                f"{r['worker_mb']:.0f} MB, tree {r['tree_mb']:.0f} MB, rc {r['rc']}",
                flush=True,
            )
    for rows in [int(x) for x in args.gbk_probe.split(",") if x]:
        for workers in [int(x) for x in args.gbk_probe_workers.split(",") if x]:
            r = gbk_probe(rows, work, workers)
            print(
                f"bare GroupByKey of {rows:,} elements, {workers or 'one per core'} workers: {r['wall_s']:.1f} s, "
                f"largest SDK worker {r['worker_mb']:.0f} MB, runner {r['runner_mb']:.0f} MB, rc {r['rc']}",
                flush=True,
            )
    flink = (
        plan_rows_on_flink([int(x) for x in args.flink_sizes.split(",") if x], work, tm_memory=args.flink_tm_memory)
        if args.flink_sizes
        else []
    )
    print()
    if flink:
        print(
            f"| FlinkRunner, 2 TaskManagers of {args.flink_tm_memory}, parallelism 4, --plan_only | rows | wall "
            "s | rows/s | "
            "largest SDK worker MB | largest TaskManager MB |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for rows, r in flink:
            print(
                f"| {'ok' if r['rc'] == 0 else 'failed'} | {rows:,} | {r['wall_s']:.1f} | {rows / r['wall_s']:,.0f} | "
                f"{r['worker_mb']:,.0f} | {r['taskmanager_mb']:,.0f} |"
            )
        print()
    print("| job | rows | wall s | rows/s | largest SDK worker MB | runner process MB | process tree MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rows, r in rows_out:
        state = "" if r["rc"] == 0 else f" (exit {r['rc']})"
        print(
            f"| {name}{state} | {rows:,} | {r['wall_s']:.1f} | {rows / r['wall_s']:,.0f} | {r['worker_mb']:,.0f} | "
            f"{r['runner_mb']:,.0f} | {r['tree_mb']:,.0f} |"
        )
    new = {rows: r for name, rows, r in rows_out if name.startswith("this job") and r["rc"] == 0}
    if len(new) >= 2:
        sizes = sorted(new)
        small, large = sizes[0], sizes[-1]
        print(
            f"\ntime {large:,} / {small:,} rows: {new[large]['wall_s'] / new[small]['wall_s']:.2f}x for "
            f"{large / small:.0f}x the rows; largest SDK worker "
            f"{new[large]['worker_mb'] / new[small]['worker_mb']:.2f}x; "
            f"runner process {new[large]['runner_mb'] / new[small]['runner_mb']:.2f}x"
        )
    if args.photos:
        print("\n| conversion | photos | wall s | images/s | process tree MB |")
        print("|---|---:|---:|---:|---:|")
        results = {}
        for count in [int(s) for s in args.photos.split(",") if s]:
            r = convert_photos(count, work)
            results[count] = r
            print(
                f"| this job, local runner{'' if r['rc'] == 0 else ' (failed)'} | {count:,} | "
                f"{r['wall_s']:.1f} | {r['images_per_s']:.0f} | {r['tree_mb']:,.0f} |",
                flush=True,
            )
        if len(results) >= 2:
            small, large = min(results), max(results)
            print(
                f"\nimages/s {large:,} / {small:,}: "
                f"{results[large]['images_per_s'] / results[small]['images_per_s']:.2f}x; "
                f"peak tree RSS {results[large]['tree_mb'] / results[small]['tree_mb']:.2f}x"
            )


if __name__ == "__main__":
    main()

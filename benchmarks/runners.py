"""What a cluster runner costs: the same 2000 real photos through the local runner, the portable job
service, FlinkRunner on a loopback Flink cluster with one and with two TaskManagers, and SparkRunner
on a loopback Spark standalone cluster with one Worker of 2 cores.

    python benchmarks/runners.py [--num_images 2000] [--runners local,portable,flink1,flink2,spark]
                                 [--resample antialias] [--work_dir DIR] [--json FILE]

Each job runs as a whole process through its launch script, and its time is split where the
first shard starts being written (the first `.tmp-` file in the run's folder):
- start-up: the runner itself, job submission, SDK workers, listing and planning;
- conversion: from the first shard written to the process exit (decode, resize, encode, write,
  manifest).
The cluster's own start (`flink_cluster.sh start`, `spark_cluster.sh start`) is a separate
column: a long-lived cluster pays it once. Every runner's output is checked byte-identical to the
local runner's. This is a benchmark, not a test: numbers on a shared 2-core machine are noisy,
so quote them with the run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from beam_jobs.sample_data import make_photo_tree  # noqa: E402

LAUNCH = REPO_ROOT / "launch"
JOB_FLAGS = ["--image_size", "224", "--num_shards", "8"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_job(args: list[str], out: pathlib.Path) -> dict[str, float]:
    """Runs one job; returns its start-up and conversion seconds, split at the first shard write."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        args, env=_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    first_shard = None
    while proc.poll() is None:
        # Shards are written in the run's own folder, out/shards/<run>/.
        if first_shard is None and out.exists() and any(out.glob("shards/*/.tmp-*")):
            first_shard = time.perf_counter()
        time.sleep(0.05)
    end = time.perf_counter()
    log = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} exited {proc.returncode}:\n{log[-4000:]}")
    first_shard = first_shard or end
    return {"startup_s": first_shard - start, "conversion_s": end - first_shard, "job_s": end - start}


def same_output(a: pathlib.Path, b: pathlib.Path) -> bool:
    """The same shards, byte for byte, and the same dead letters (in any order). Each run writes
    into its own folder, shards/<run>/, whose name differs, as do the manifests' run ids."""

    def contents(out: pathlib.Path) -> dict[str, object]:
        files = {p.name: p.read_bytes() for p in out.glob("shards/*/*.tfrecord")}
        files["dead letters"] = sorted(
            line for p in out.glob("shards/*/dead_letters*.jsonl") for line in p.read_bytes().splitlines()
        )
        return files

    return contents(a) == contents(b)


class FlinkBenchCluster:
    """flink_cluster.sh's cluster of ``taskmanagers`` x 2 slots, and how a job is submitted to it."""

    def __init__(self, state_dir: pathlib.Path, taskmanagers: int) -> None:
        rest, worker_pool = _free_port(), _free_port()
        self.parallelism = 2 * taskmanagers
        self.name = f"FlinkRunner, {taskmanagers} TaskManager(s) x 2 slots, parallelism {self.parallelism}"
        self.script = LAUNCH / "flink_cluster.sh"
        self.args = ["--state_dir", str(state_dir), "--rest_port", str(rest), "--rpc_port", str(_free_port())]
        self.args += ["--worker_pool_port", str(worker_pool), "--job_server_port", str(_free_port())]
        self.args += ["--taskmanagers", str(taskmanagers), "--slots", "2", "--taskmanager_memory", "1536m"]
        self.submit = [str(LAUNCH / "submit_flink.sh"), "--flink_master", f"127.0.0.1:{rest}"]
        self.submit += ["--environment_config", f"127.0.0.1:{worker_pool}", "--parallelism", str(self.parallelism)]


class SparkBenchCluster:
    """spark_cluster.sh's cluster of one Worker of 2 cores, and how a job is submitted to it."""

    def __init__(self, state_dir: pathlib.Path) -> None:
        master, worker_pool = _free_port(), _free_port()
        self.name = "SparkRunner, 1 Worker x 2 cores"
        self.script = LAUNCH / "spark_cluster.sh"
        self.args = ["--state_dir", str(state_dir), "--master_port", str(master), "--webui_port", str(_free_port())]
        self.args += ["--worker_pool_port", str(worker_pool), "--job_server_port", str(_free_port())]
        self.args += ["--workers", "1", "--cores", "2", "--worker_memory", "1536m"]
        self.submit = [str(LAUNCH / "submit_spark.sh"), "--spark_master", f"127.0.0.1:{master}"]
        self.submit += ["--environment_config", f"127.0.0.1:{worker_pool}"]


def start_cluster(cluster: FlinkBenchCluster | SparkBenchCluster) -> float:
    start = time.perf_counter()
    subprocess.run([str(cluster.script), "start", *cluster.args], env=_env(), check=True, capture_output=True)
    return time.perf_counter() - start


def stop_cluster(cluster: FlinkBenchCluster | SparkBenchCluster) -> None:
    subprocess.run([str(cluster.script), "stop", *cluster.args], env=_env(), capture_output=True)


RUNNERS = ("local", "portable", "flink1", "flink2", "spark")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--work_dir", type=pathlib.Path, default=None)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument(
        "--runners",
        default=",".join(RUNNERS),
        help=f"which runners, comma-separated (the local runner always runs): {RUNNERS}",
    )
    parser.add_argument("--resample", default=None, help="the job's --resample (default: the job's default)")
    args = parser.parse_args(argv)
    chosen = set(args.runners.split(",")) | {"local"}
    if chosen - set(RUNNERS):
        parser.error(f"--runners: unknown {sorted(chosen - set(RUNNERS))} (known: {', '.join(RUNNERS)})")
    flags = [*JOB_FLAGS, *(["--resample", args.resample] if args.resample else [])]
    work = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="runners-bench-"))
    images = work / "images"
    if not images.exists():
        make_photo_tree(images, num_images=args.num_images, size=(500, 375), seed=11)

    rows = []

    def job_args(out: pathlib.Path) -> list[str]:
        return ["--input", str(images), "--output_dir", str(out), *flags]

    local = work / "out-local"
    shutil.rmtree(local, ignore_errors=True)
    rows.append(
        {
            "runner": "local runner (FnApiRunner, all cores)",
            "cluster_s": 0.0,
            **timed_job([sys.executable, "-m", "beam_jobs", *job_args(local)], local),
        }
    )
    if "portable" in chosen:
        portable = work / "out-portable"
        shutil.rmtree(portable, ignore_errors=True)
        rows.append(
            {
                "runner": "portable job service + worker pool (run_portable.sh)",
                "cluster_s": 0.0,
                **timed_job([str(LAUNCH / "run_portable.sh"), *job_args(portable)], portable),
            }
        )
        rows[-1]["same_bytes"] = same_output(portable, local)
    clusters = {
        "flink1": lambda: FlinkBenchCluster(work / "flink-1tm", 1),
        "flink2": lambda: FlinkBenchCluster(work / "flink-2tm", 2),
        "spark": lambda: SparkBenchCluster(work / "spark"),
    }
    for key, make in clusters.items():
        if key not in chosen:
            continue
        cluster = make()
        try:
            cluster_s = start_cluster(cluster)
            # The first job after the cluster's start, then one on a cluster that has run a job
            # (its job server's JVM warm), as a long-lived cluster runs most of its jobs.
            for job in ("first job", "next job"):
                out = work / f"out-{key}-{job.split()[0]}"
                shutil.rmtree(out, ignore_errors=True)
                timing = timed_job([*cluster.submit, *job_args(out)], out)
                rows.append(
                    {
                        "runner": f"{cluster.name}, {job}",
                        "cluster_s": cluster_s if job == "first job" else 0.0,
                        **timing,
                        "same_bytes": same_output(out, local),
                    }
                )
        finally:
            stop_cluster(cluster)

    n = args.num_images
    print(f"{n} real photos 500x375 -> 224 px JPEG, 8 shards, {' '.join(flags)}; {os.cpu_count()} cores")
    print(
        "| runner | cluster start s | job start-up s | conversion s | conversion / local | job total s"
        " | img/s conversion | img/s job | same bytes as local |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['runner']} | {r['cluster_s']:.1f} | {r['startup_s']:.1f} | {r['conversion_s']:.1f} | "
            f"{r['conversion_s'] / rows[0]['conversion_s']:.2f}x | "
            f"{r['job_s']:.1f} | {n / r['conversion_s']:.0f} | {n / r['job_s']:.0f} | "
            f"{'yes' if r.get('same_bytes', True) else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

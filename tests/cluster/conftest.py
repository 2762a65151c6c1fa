"""Fixtures for the cluster tests: test data, a local-runner reference output, and loopback services
(a Flink or Spark cluster with an SDK worker pool) that are always stopped, even when a test fails."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = REPO_ROOT / "launch"
# The defaults of launch/flink_cluster.sh and submit_flink.sh (pinned in launch/flink_job_server/pom.xml).
FLINK_VERSION = "1.19.3"
# launch/spark_cluster.sh's default (pinned in launch/spark_job_server/pom.xml).
SPARK_VERSION = "3.5.5"
# The test tree has 7 broken files among 43 inputs: far above the job's default bad-input limit.
JOB_FLAGS = ["--image_size", "224", "--num_shards", "4", "--max_bad_fraction", "0.5"]
# Large enough that converting it takes several seconds on a cluster, so a kill lands mid-job.
BIG_TREE_FLAGS = ["--image_size", "224", "--num_shards", "8"]


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: starts real services (Flink, job service, worker pool)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def job_env() -> dict[str, str]:
    """The environment for scripts and jobs: this interpreter first on PATH (SDK workers and the
    job server start `python` from PATH), and the cache shared across runs."""
    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_script(args: list[str], *, timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Runs a launch/ script or a job with a hard timeout, capturing its output for the report."""
    proc = subprocess.run(args, env=job_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{args[0]} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def ports_still_held(ports: set[int], processes: list, state_dir: pathlib.Path) -> dict[int, str]:
    """{port: its listener} for each of a stopped cluster's ports that one of its own processes
    still holds. A freed ephemeral port (a TaskManager's data port, say) can be taken at once by
    an unrelated process, such as a test on another xdist worker: that is not a leftover, so a
    port counts only when its listener is one of the cluster's processes or names its state folder."""
    import psutil

    ours = {p.pid for p in processes}
    held = {}
    for conn in psutil.net_connections("tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.laddr.port not in ports:
            continue
        try:
            cmdline = " ".join(psutil.Process(conn.pid).cmdline()) if conn.pid else ""
        except psutil.Error:
            continue  # it ended between the two calls
        if conn.pid is None or conn.pid in ours or str(state_dir) in cmdline:
            held[conn.laddr.port] = f"pid {conn.pid}: {cmdline[:300]}"
    return held


def rest_get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read().decode())


def output_files(folder: pathlib.Path) -> dict[str, bytes]:
    """{file name: bytes} of the current version a conversion committed (tests/dataset_files.py:
    shards by their names in the run folder, dataset_info.json without the commit's own facts),
    checking that nothing else was left (no temp files, no other run folder)."""
    from tests.dataset_files import current_files, flat_names  # pylint: disable=import-outside-toplevel

    files = current_files(folder)
    assert flat_names(folder) == sorted(files), f"unexpected files: {flat_names(folder)}"
    return files


def assert_same_output(actual: pathlib.Path, expected: pathlib.Path) -> None:
    got, want = output_files(actual), output_files(expected)
    assert sorted(got) == sorted(want), f"files differ: {sorted(got)} vs {sorted(want)}"
    for name in want:
        if name.endswith("dead_letters.jsonl"):
            # Same dead-letter set; line order is not part of the contract.
            assert sorted(got[name].splitlines()) == sorted(want[name].splitlines())
        else:
            assert got[name] == want[name], f"{name} differs from the local runner's"


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory) -> pathlib.Path:
    """36 real photos (9 classes) plus 7 broken files and 2 files that must be ignored."""
    from tests.photos import make_test_tree

    root = tmp_path_factory.mktemp("cluster-photos") / "images"
    make_test_tree(root, num_images=36)
    return root


@pytest.fixture(scope="session")
def local_output(photo_tree, tmp_path_factory) -> pathlib.Path:
    """The reference: the same conversion on the default local runner (no --runner)."""
    out = tmp_path_factory.mktemp("local") / "out"
    run_script(
        [sys.executable, "-m", "beam_jobs", "--input", str(photo_tree), "--output_dir", str(out), *JOB_FLAGS],
        timeout=300,
    )
    return out


@pytest.fixture(scope="session")
def big_tree(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """800 real photos (500x375) and their conversion on the local runner, the reference."""
    from beam_jobs.sample_data import make_photo_tree

    root = tmp_path_factory.mktemp("big")
    make_photo_tree(root / "images", num_images=800, size=(500, 375), seed=3)
    run_script(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(root / "images"),
            "--output_dir",
            str(root / "local"),
            *BIG_TREE_FLAGS,
        ],
        timeout=400,
    )
    return root / "images", root / "local"


class FlinkCluster:
    """A loopback cluster started with launch/flink_cluster.sh in its own state dir."""

    def __init__(
        self, state_dir: pathlib.Path, *, taskmanagers: int = 1, slots: int = 2, restart_attempts: int = 3
    ) -> None:
        self.state_dir = state_dir
        self.rest_port = free_port()
        self.rpc_port = free_port()
        self.worker_pool_port = free_port()
        self.job_server_port = free_port()
        self.taskmanagers = taskmanagers
        self.slots = slots
        self.restart_attempts = restart_attempts

    @property
    def flink_master(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    @property
    def worker_pool(self) -> str:
        return f"127.0.0.1:{self.worker_pool_port}"

    def _args(self, command: str) -> list[str]:
        return [
            str(LAUNCH / "flink_cluster.sh"),
            command,
            "--state_dir",
            str(self.state_dir),
            "--rest_port",
            str(self.rest_port),
            "--rpc_port",
            str(self.rpc_port),
            "--worker_pool_port",
            str(self.worker_pool_port),
            "--job_server_port",
            str(self.job_server_port),
            "--flink_version",
            FLINK_VERSION,
            "--taskmanagers",
            str(self.taskmanagers),
            "--slots",
            str(self.slots),
            "--taskmanager_memory",
            "1536m",
            "--timeout",
            "120",
            "--restart_attempts",
            str(self.restart_attempts),
            "--restart_delay",
            "5 s",  # 1 s: the restarts (3) all went to the killed TaskManager before Flink knew it lost
        ]

    def start(self) -> None:
        run_script(self._args("start"), timeout=600)  # the first run installs Flink from PyPI

    def stop(self) -> None:
        run_script(self._args("stop"), timeout=120, check=False)

    def taskmanager_pids(self) -> list[int]:
        """The TaskManagers' pids, in start order: pid i is the TaskManager named tm-i."""
        pids = []
        for pidfile in (self.state_dir / "pid").glob("*taskexecutor.pid"):
            pids += [int(line) for line in pidfile.read_text().split() if line.strip()]
        return pids

    def all_pids(self) -> list[int]:
        """Every process that start launched: JobManager, TaskManagers and the worker pool."""
        pids = []
        for pidfile in (self.state_dir / "pid").glob("*.pid"):
            pids += [int(line) for line in pidfile.read_text().split() if line.strip()]
        return pids

    def jobs(self) -> list[dict]:
        return rest_get(self.rest_port, "/jobs/overview")["jobs"]

    def job_ids(self) -> set[str]:
        return {job["jid"] for job in self.jobs()}

    def new_job(self, before: set[str]) -> dict:
        """The one job submitted since job_ids() returned before (the session cluster runs several)."""
        jobs = [job for job in self.jobs() if job["jid"] not in before]
        assert len(jobs) == 1, jobs
        return jobs[0]

    def only_job(self) -> dict:
        jobs = self.jobs()
        assert len(jobs) == 1, jobs
        return jobs[0]

    def vertex_subtasks(self, job_id: str, name_part: str) -> list[dict]:
        """The subtasks of the job's vertex whose name contains name_part (status, taskmanager-id)."""
        job = rest_get(self.rest_port, f"/jobs/{job_id}")
        (vertex,) = [v for v in job["vertices"] if name_part in v["name"]]
        return rest_get(self.rest_port, f"/jobs/{job_id}/vertices/{vertex['id']}")["subtasks"]

    def sdk_workers_started(self, job_name: str) -> int:
        """How many Python SDK workers the job started: each logs its pipeline options, job name
        included, into its TaskManager's log once it is up."""
        logs = (self.state_dir / "log").glob("*taskexecutor*.log")
        lines = [line for log in logs for line in log.read_text().splitlines()]
        return sum("Pipeline_options" in line and job_name in line for line in lines)

    def taskmanagers_used(self, job_id: str) -> set[str]:
        job = rest_get(self.rest_port, f"/jobs/{job_id}")
        used = set()
        for vertex in job["vertices"]:
            info = rest_get(self.rest_port, f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")
            used |= {tm["taskmanager-id"] for tm in info["taskmanagers"]}
        return used


class SparkCluster:
    """A loopback Spark standalone cluster started with launch/spark_cluster.sh in its own state dir."""

    def __init__(self, state_dir: pathlib.Path, *, workers: int = 1, cores: int = 2) -> None:
        self.state_dir = state_dir
        self.master_port = free_port()
        self.webui_port = free_port()
        self.worker_pool_port = free_port()
        self.job_server_port = free_port()
        self.workers = workers
        self.cores = cores

    @property
    def spark_master(self) -> str:
        return f"127.0.0.1:{self.master_port}"

    @property
    def worker_pool(self) -> str:
        return f"127.0.0.1:{self.worker_pool_port}"

    def args(self, command: str) -> list[str]:
        return [
            str(LAUNCH / "spark_cluster.sh"),
            command,
            "--state_dir",
            str(self.state_dir),
            "--master_port",
            str(self.master_port),
            "--webui_port",
            str(self.webui_port),
            "--worker_pool_port",
            str(self.worker_pool_port),
            "--job_server_port",
            str(self.job_server_port),
            "--spark_version",
            SPARK_VERSION,
            "--workers",
            str(self.workers),
            "--cores",
            str(self.cores),
            "--worker_memory",
            "1536m",
        ]

    def start(self) -> None:
        run_script(self.args("start"), timeout=600)  # the first run installs Spark and builds the job server

    def stop(self) -> None:
        run_script(self.args("stop"), timeout=120, check=False)

    def submit_args(self, job_args: list[str]) -> list[str]:
        """submit_spark.sh against this cluster, with the job server spark_cluster.sh keeps for it."""
        return [
            str(LAUNCH / "submit_spark.sh"),
            "--spark_master",
            self.spark_master,
            "--environment_config",
            self.worker_pool,
            *job_args,
        ]

    def overview(self) -> dict:
        return rest_get(self.webui_port, "/json/")

    def all_pids(self) -> list[int]:
        """Every process that start launched: the Master, the Workers' supervisors, the worker pool
        and the job server."""
        return [int(f.read_text().split()[0]) for f in (self.state_dir / "pid").glob("*.pid") if f.read_text().strip()]

    def worker_jvms(self) -> list[int]:
        """The Worker JVMs now running under the supervisors (a restarted Worker has a new pid)."""
        import psutil  # pylint: disable=import-outside-toplevel

        pids = []
        # worker-N.pid, a Worker's supervisor; not worker-pool.pid, whose process a test may have killed.
        for f in (self.state_dir / "pid").glob("worker-[0-9]*.pid"):
            try:
                children = psutil.Process(int(f.read_text().split()[0])).children(recursive=True)
            except psutil.NoSuchProcess:  # a supervisor killed, its pid file not yet removed
                continue
            for child in children:
                try:  # a killed executor may be a zombie its Worker has not reaped yet
                    if child.name() == "java" and "org.apache.spark.deploy.worker.Worker" in child.cmdline():
                        pids.append(child.pid)
                except psutil.Error:
                    continue
        return pids


def wait_for(predicate, *, timeout: float, interval: float = 1.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")

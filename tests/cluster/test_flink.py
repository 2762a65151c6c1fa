"""FlinkRunner on a real Flink 1.19 cluster on loopback, with Beam's Flink job server built from
Maven Central by the launch scripts: the same bytes as the local runner with one or two
TaskManagers, a SIGKILLed TaskManager survived (or, with restarts disabled, a clean failure), and
a stop that leaves nothing behind. One session cluster (2 TaskManagers x 2 slots) serves every test
that does not kill a TaskManager; the two that do start their own."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess

import psutil
import pytest

from tests.cluster.conftest import (
    BIG_TREE_FLAGS,
    FLINK_VERSION,
    JOB_FLAGS,
    LAUNCH,
    FlinkCluster,
    assert_same_output,
    job_env,
    port_open,
    ports_still_held,
    rest_get,
    run_script,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _submit_args(cluster: FlinkCluster, *, parallelism: int, job_args: list[str]) -> list[str]:
    """submit_flink.sh against the cluster, with the job server that flink_cluster.sh keeps for it
    (the S3 test and the interrupt test submit with a job server started for the job)."""
    return [
        str(LAUNCH / "submit_flink.sh"),
        "--flink_master",
        cluster.flink_master,
        "--environment_config",
        cluster.worker_pool,
        "--parallelism",
        str(parallelism),
        *job_args,
    ]


def _final_names(folder: pathlib.Path) -> list[str]:
    """What a reader could take for a dataset: the visible top-level files (run folders under
    shards/ hold nothing a reader uses until a committed manifest lists them)."""
    return (
        sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and p.name != "shards")
        if folder.exists()
        else []
    )


def _kill_a_converting_taskmanager(cluster: FlinkCluster, out: pathlib.Path) -> str:
    """SIGKILLs the TaskManager that is converting a shard right now; returns its id (tm-N)."""
    job = wait_for(
        lambda: next((j for j in cluster.jobs() if j["state"] == "RUNNING"), None), timeout=240, what="a RUNNING job"
    )

    def converting_taskmanager() -> str | None:
        if not any(out.glob("shards/*/.tmp-*")):
            return None  # no shard is being written yet
        try:
            subtasks = cluster.vertex_subtasks(job["jid"], "ConvertShards")
        except (OSError, ValueError):
            return None
        running = [s["taskmanager-id"] for s in subtasks if s["status"] == "RUNNING"]
        return running[0] if running else None

    victim = wait_for(converting_taskmanager, timeout=300, interval=0.3, what="a shard being converted")
    os.kill(cluster.taskmanager_pids()[int(victim.removeprefix("tm-"))], signal.SIGKILL)
    return victim


def _run_and_kill(cluster: FlinkCluster, images: pathlib.Path, out: pathlib.Path):
    job = subprocess.Popen(
        _submit_args(
            cluster, parallelism=2, job_args=["--input", str(images), "--output_dir", str(out), *BIG_TREE_FLAGS]
        ),
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        victim = _kill_a_converting_taskmanager(cluster, out)
        log, _ = job.communicate(timeout=480)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return victim, job.returncode, log


# The pytest timeouts below are hang guards for each test's own body (func_only): the session's
# fixtures (the first Flink install, the job server build, a cluster's start) have hard timeouts of
# their own, and on a cold machine they alone outran a timeout that counted them too. Each is the
# sum of its body's own subprocess timeouts, with room.
@pytest.mark.timeout(900, func_only=True)  # the submit: 540 s
def test_two_taskmanagers_with_parallelism_4_match_local(
    flink_job_server_jar, flink_cluster, local_output, photo_tree, tmp_path
):
    out = tmp_path / "out"
    before = flink_cluster.job_ids()
    proc = run_script(
        _submit_args(
            flink_cluster,
            parallelism=4,
            # --max_bundle_size: an option of Flink's runner, not of Beam Python (job_server_flags.py)
            job_args=["--input", str(photo_tree), "--output_dir", str(out), *JOB_FLAGS, "--max_bundle_size=777"],
        ),
        timeout=540,
    )
    assert "--runner=FlinkRunner" in proc.stderr
    assert f"job server: 127.0.0.1:{flink_cluster.job_server_port}" in proc.stderr  # the cluster's own
    assert_same_output(out, local_output)
    job = flink_cluster.new_job(before)
    assert job["state"] == "FINISHED", job
    assert flink_cluster.taskmanagers_used(job["jid"]) == {"tm-0", "tm-1"}
    # One SDK worker per task slot for the whole job (2 TaskManagers x 2): they serve every stage.
    # Without Beam's runner on the cluster's classpath, each of the job's 9 stages started its own.
    # A slot left idle between two of its stages for longer than --environment_cache_millis (10 s,
    # submit_flink.sh) starts a fresh one: with the suite's other tests loading the machine, 6
    # were counted once. Fewer than the stages still says the workers serve several stages.
    started = flink_cluster.sdk_workers_started(job["name"])
    assert 4 <= started < 9, started
    # The job's counters reach Flink as an accumulator, which the web UI shows per job.
    accumulators = rest_get(flink_cluster.rest_port, f"/jobs/{job['jid']}/accumulators")
    assert "images_written" in str(accumulators["user-task-accumulators"])
    # The runner's own option reached the Flink job, as the runner took it from the job server.
    config = rest_get(flink_cluster.rest_port, f"/jobs/{job['jid']}/config")
    assert config["execution-config"]["user-config"]["maxBundleSize"] == "777"


@pytest.mark.timeout(2100, func_only=True)  # a cluster's start (600 s), _run_and_kill (1020 s), its stop
def test_killed_taskmanager_job_restarts_and_matches_local(flink_job_server_jar, big_tree, tmp_path):
    images, reference = big_tree
    out = tmp_path / "out"
    # A cluster of its own: the kill leaves it one TaskManager short.
    cluster = FlinkCluster(tmp_path / "flink", taskmanagers=2, slots=2)
    try:
        cluster.start()
        victim, returncode, log = _run_and_kill(cluster, images, out)
        assert returncode == 0, log[-6000:]
        job = cluster.only_job()
        assert job["state"] == "FINISHED", job
        # The kill landed mid-job: Flink recorded the lost TaskManager and restarted the failed tasks.
        history = rest_get(cluster.rest_port, f"/jobs/{job['jid']}/exceptions")["exceptionHistory"]["entries"]
    finally:
        cluster.stop()
    assert history, "Flink recorded no failure: the TaskManager was not killed mid-job"
    assert any(victim in str(entry) for entry in history), history
    # No record lost, none duplicated: the same bytes as the local runner.
    assert_same_output(out, reference)


def _listening_ports(pids: list[int]) -> set[int]:
    ports = set()
    for pid in pids:
        for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            ports |= {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return ports


@pytest.mark.timeout(2100, func_only=True)  # a cluster's start (600 s), _run_and_kill (1020 s), its stop
def test_killed_taskmanager_without_restarts_fails_cleanly_and_stop_leaves_nothing(
    flink_job_server_jar, big_tree, tmp_path
):
    images, _ = big_tree
    out = tmp_path / "out"
    cluster = FlinkCluster(tmp_path / "flink", taskmanagers=2, slots=2, restart_attempts=0)
    try:
        cluster.start()
        pids = cluster.all_pids()
        processes = [p for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
        ports = _listening_ports(pids)
        # JobManager, 2 TaskManagers, the worker pool and the job server, with their ports.
        assert len(pids) == 5, pids
        assert {cluster.rest_port, cluster.rpc_port, cluster.worker_pool_port, cluster.job_server_port} <= ports, ports
        _, returncode, log = _run_and_kill(cluster, images, out)
        assert returncode != 0, log[-6000:]
        assert cluster.only_job()["state"] == "FAILED"
    finally:
        cluster.stop()
    # Nothing under a final name: no shard a reader could mistake for a dataset, no manifest.
    assert _final_names(out) == [], _final_names(out)
    # The stop leaves no process (the killed TaskManager's included), no port and no pid file.
    still_running = [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert still_running == [], still_running
    assert ports_still_held(ports, processes, cluster.state_dir) == {}
    assert not list((cluster.state_dir / "pid").glob("*.pid"))
    proc = run_script(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "status",
            "--state_dir",
            str(cluster.state_dir),
            "--rest_port",
            str(cluster.rest_port),
        ],
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1


def test_flink_cluster_is_up_on_loopback(flink_cluster):
    overview = rest_get(flink_cluster.rest_port, "/overview")
    assert overview["flink-version"] == FLINK_VERSION
    assert overview["taskmanagers"] == 2 and overview["slots-total"] == 4
    assert port_open(flink_cluster.worker_pool_port)
    status = run_script(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "status",
            "--state_dir",
            str(flink_cluster.state_dir),
            "--rest_port",
            str(flink_cluster.rest_port),
        ],
        timeout=60,
    )
    assert "worker pool: running" in status.stdout
    config = (flink_cluster.state_dir / "conf" / "config.yaml").read_text()
    assert "rest.bind-address: 127.0.0.1" in config and "restart-strategy.type: fixed-delay" in config


def test_another_clusters_rest_api_is_not_taken_for_this_state_dirs(flink_cluster, tmp_path):
    # A real JobManager answers on the port; a state dir whose cluster did not start must not
    # report it as its own (start checks the same thing: who listens, not only that someone does).
    other = tmp_path / "other"
    (other / "pid").mkdir(parents=True)
    proc = run_script(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "status",
            "--state_dir",
            str(other),
            "--rest_port",
            str(flink_cluster.rest_port),
        ],
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout
    assert "not this state dir's JobManager" in proc.stdout, proc.stdout
    # The cluster that does hold the port is still its own state dir's, and left alone.
    mine = run_script(
        [str(LAUNCH / "flink_cluster.sh"), "status", "--state_dir", str(flink_cluster.state_dir)], timeout=60
    )
    assert mine.returncode == 0 and "Flink at http://127.0.0.1:" in mine.stdout

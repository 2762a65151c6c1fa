"""The same conversion on the local runner, a portable job service, and a real Flink cluster must
give byte-identical shards, an identical dataset_info.json and the same dead letters."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import (
    JOB_FLAGS,
    LAUNCH,
    FlinkCluster,
    assert_same_output,
    job_env,
    output_files,
    port_open,
    rest_get,
    run_script,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_local_output_is_complete(local_output, photo_tree):
    files = output_files(local_output)
    assert sorted(files) == ["dataset_info.json", "dead_letters.jsonl"] + [
        f"train-0000{i}-of-00004.tfrecord" for i in range(4)]
    assert len(files["dead_letters.jsonl"].splitlines()) == 7


@pytest.mark.timeout(300)
def test_portable_job_service_matches_local(local_output, photo_tree, tmp_path):
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    proc = run_script([str(LAUNCH / "run_portable.sh"), "--log_dir", str(logs),
                       "--input", str(photo_tree), "--output_dir", str(out), *JOB_FLAGS], timeout=240)
    assert "--runner=PortableRunner" in proc.stderr
    assert_same_output(out, local_output)
    # run_portable.sh stops the job service and worker pool it started.
    assert not (logs / "job-service.pid").exists() and not (logs / "worker-pool.pid").exists()


@pytest.mark.timeout(300)
def test_portable_job_service_with_the_clusters_worker_pool(flink_cluster, local_output, photo_tree, tmp_path):
    # The worker pool that flink_cluster.sh starts serves any portable runner.
    out = tmp_path / "out"
    run_script([str(LAUNCH / "run_portable.sh"), "--worker_pool", flink_cluster.worker_pool,
                "--input", str(photo_tree), "--output_dir", str(out), *JOB_FLAGS], timeout=240)
    assert_same_output(out, local_output)


@pytest.mark.timeout(600)
@pytest.mark.needs_flink_job_server
def test_flink_runner_matches_local(flink_job_server_jar, flink_cluster, local_output, photo_tree, tmp_path):
    out = tmp_path / "out"
    run_script([str(LAUNCH / "submit_flink.sh"), "--flink_master", flink_cluster.flink_master,
                "--environment_config", flink_cluster.worker_pool, "--parallelism", "2",
                "--flink_job_server_jar", flink_job_server_jar,
                "--input", str(photo_tree), "--output_dir", str(out), *JOB_FLAGS], timeout=540)
    assert_same_output(out, local_output)
    jobs = flink_cluster.jobs()
    assert jobs and jobs[-1]["state"] == "FINISHED", jobs


@pytest.fixture
def big_photo_tree(tmp_path_factory) -> pathlib.Path:
    from beam_jobs.sample_data import make_photo_tree

    root = tmp_path_factory.mktemp("big") / "images"
    make_photo_tree(root, num_images=1200, size=(500, 375), seed=3)
    return root


@pytest.mark.timeout(900)
@pytest.mark.needs_flink_job_server
def test_flink_survives_a_killed_taskmanager(flink_job_server_jar, big_photo_tree, tmp_path):
    # Two TaskManagers: when one dies, the restart strategy reschedules on the other's free slots.
    reference = tmp_path / "local"
    flags = ["--input", str(big_photo_tree), "--image_size", "224", "--num_shards", "8"]
    run_script([sys.executable, "-m", "beam_jobs", "--output_dir", str(reference), *flags], timeout=400)

    cluster = FlinkCluster(tmp_path / "flink", taskmanagers=2, slots=2)
    out = tmp_path / "out"
    try:
        cluster.start()
        job = subprocess.Popen(
            [str(LAUNCH / "submit_flink.sh"), "--flink_master", cluster.flink_master,
             "--environment_config", cluster.worker_pool, "--parallelism", "2",
             "--flink_job_server_jar", flink_job_server_jar, "--output_dir", str(out), *flags],
            env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            wait_for(lambda: any(j["state"] == "RUNNING" for j in cluster.jobs()), timeout=180, what="a RUNNING job")
            # Mid-job: some shard is being written (a temp file exists) but the job is not done.
            wait_for(lambda: out.exists() and any(p.name.startswith(".") or "tmp" in p.name for p in out.iterdir()),
                     timeout=300, interval=0.5, what="a shard in progress")
            victim = cluster.taskmanager_pids()[0]
            os.kill(victim, signal.SIGKILL)
            log, _ = job.communicate(timeout=600)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        assert job.returncode == 0, log[-6000:]
        jobs = cluster.jobs()
        assert jobs[-1]["state"] == "FINISHED", jobs
        assert_same_output(out, reference)
    finally:
        cluster.stop()


def test_flink_cluster_is_up_on_loopback(flink_cluster):
    overview = rest_get(flink_cluster.rest_port, "/overview")
    assert overview["flink-version"] == "1.20.3"
    assert overview["taskmanagers"] == 1 and overview["slots-total"] == 2
    assert port_open(flink_cluster.worker_pool_port)
    status = run_script([str(LAUNCH / "flink_cluster.sh"), "status", "--state_dir", str(flink_cluster.state_dir),
                         "--rest_port", str(flink_cluster.rest_port)], timeout=60)
    assert "worker pool: running" in status.stdout
    config = (flink_cluster.state_dir / "conf" / "config.yaml").read_text()
    assert "rest.bind-address: 127.0.0.1" in config and "restart-strategy.type: fixed-delay" in config


@pytest.mark.timeout(300)
def test_flink_cluster_script_stops_everything(tmp_path):
    cluster = FlinkCluster(tmp_path / "flink")
    try:
        cluster.start()
        assert port_open(cluster.rest_port) and port_open(cluster.worker_pool_port)
        pids = cluster.taskmanager_pids()
        assert pids
    finally:
        cluster.stop()
    assert not port_open(cluster.rest_port) and not port_open(cluster.worker_pool_port)
    time.sleep(1)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    proc = run_script([str(LAUNCH / "flink_cluster.sh"), "status", "--state_dir", str(cluster.state_dir),
                       "--rest_port", str(cluster.rest_port)], timeout=60, check=False)
    assert proc.returncode == 1

"""SparkRunner on a real Spark 3.5 standalone cluster on loopback (the Master and a Worker from
PyPI's pyspark), with Beam's Spark job server built from Maven Central by the launch scripts: the
same bytes as the local runner, a SIGKILLed Worker and a SIGKILLed executor survived, an interrupt
that cancels the job and a --resume that finishes it, and a stop that leaves nothing behind."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess

import grpc
import psutil
import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

from tests.cluster.conftest import (
    BIG_TREE_FLAGS,
    JOB_FLAGS,
    LAUNCH,
    SPARK_VERSION,
    SparkCluster,
    assert_same_output,
    job_env,
    port_open,
    ports_still_held,
    run_script,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _jobs(cluster: SparkCluster) -> dict[str, int]:
    """{job name: state} of the jobs the cluster's job server has run (Beam's job API)."""
    with grpc.insecure_channel(f"127.0.0.1:{cluster.job_server_port}") as channel:
        service = beam_job_api_pb2_grpc.JobServiceStub(channel)
        return {
            job.job_name: job.state for job in service.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10).job_info
        }


def _status(cluster: SparkCluster) -> subprocess.CompletedProcess:
    return run_script(cluster.args("status"), timeout=60, check=False)


@pytest.mark.timeout(900, func_only=True)
def test_a_job_on_the_cluster_matches_local(spark_cluster, local_output, photo_tree, tmp_path):
    out = tmp_path / "out"
    proc = run_script(
        spark_cluster.submit_args(
            ["--input", str(photo_tree), "--output_dir", str(out), "--job_name", "match", *JOB_FLAGS]
        ),
        timeout=540,
    )
    assert "--runner=SparkRunner" in proc.stderr
    assert f"job server: 127.0.0.1:{spark_cluster.job_server_port}" in proc.stderr  # the cluster's own
    assert "--sdk_worker_parallelism=2" in proc.stderr  # one SDK worker per core of the Worker
    assert_same_output(out, local_output)
    assert _jobs(spark_cluster)["match"] == beam_job_api_pb2.JobState.DONE
    status = _status(spark_cluster)
    assert status.returncode == 0, status.stdout
    assert f"Spark spark://{spark_cluster.spark_master}: ALIVE, 1 alive Worker(s), 2 cores" in status.stdout


def _run_and_kill(cluster: SparkCluster, images: pathlib.Path, out: pathlib.Path, marker: str) -> tuple[int, str]:
    """Submits a job and SIGKILLs the cluster's Java process whose command line holds ``marker``
    (the Worker, or the executor a Worker started for the job) while a shard is being written."""
    job = subprocess.Popen(
        cluster.submit_args(["--input", str(images), "--output_dir", str(out), *BIG_TREE_FLAGS]),
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: any(out.glob("shards/*/.tmp-*")), timeout=300, interval=0.1, what="a shard being converted")
        supervisor = psutil.Process(int((cluster.state_dir / "pid" / "worker-0.pid").read_text().split()[0]))
        victims = [
            p
            for p in supervisor.children(recursive=True)
            if p.name() == "java" and any(marker in a for a in p.cmdline())
        ]
        assert len(victims) == 1, victims
        victims[0].kill()
        log, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, log


def _listening_ports(pids: list[int]) -> set[int]:
    ports = set()
    for pid in pids:
        for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            ports |= {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return ports


@pytest.mark.timeout(2400, func_only=True)  # a cluster's start (600 s), two jobs (600 s each), its stop
def test_a_killed_worker_and_a_killed_executor_are_survived_and_stop_leaves_nothing(
    spark_job_server_jar, big_tree, tmp_path
):
    images, reference = big_tree
    # A cluster of its own: the kills take its Worker down for a while.
    cluster = SparkCluster(tmp_path / "spark")
    try:
        cluster.start()
        pids = cluster.all_pids()
        processes = [p for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
        ports = _listening_ports(pids)
        # The Master, a Worker's supervisor, the worker pool and the job server, with their ports.
        assert len(pids) == 4, pids
        assert {cluster.master_port, cluster.webui_port, cluster.worker_pool_port, cluster.job_server_port} <= ports
        first_worker = cluster.worker_jvms()

        # The Worker JVM killed mid-job: its executor ends with it, the supervisor starts a new
        # Worker, Spark runs the lost tasks on it, and the job completes with the same bytes.
        returncode, log = _run_and_kill(
            cluster, images, tmp_path / "worker-killed", "org.apache.spark.deploy.worker.Worker"
        )
        assert returncode == 0, log[-6000:]
        assert_same_output(tmp_path / "worker-killed", reference)
        assert cluster.worker_jvms() and cluster.worker_jvms() != first_worker, "the Worker was started again"
        assert "the Worker exited; starting it again" in (cluster.state_dir / "log" / "worker-0.log").read_text()

        # The executor (the JVM that runs the job's tasks and talks to the SDK workers) killed mid-job.
        returncode, log = _run_and_kill(cluster, images, tmp_path / "executor-killed", "CoarseGrainedExecutorBackend")
        assert returncode == 0, log[-6000:]
        assert_same_output(tmp_path / "executor-killed", reference)

        # status says what is down, and exits 1.
        os.killpg(int((cluster.state_dir / "pid" / "worker-pool.pid").read_text()), signal.SIGKILL)
        status = _status(cluster)
        assert status.returncode == 1 and "down: the worker pool" in status.stdout, status.stdout
        # A Worker's supervisor SIGKILLed leaves its Worker running in its process group: stop
        # (below) must end that Worker too, or it would join the next cluster's Master.
        orphans = cluster.worker_jvms()
        os.kill(int((cluster.state_dir / "pid" / "worker-0.pid").read_text()), signal.SIGKILL)
        assert "the supervisor of Worker 0" in _status(cluster).stdout
        processes += [psutil.Process(pid) for pid in orphans]
    finally:
        cluster.stop()
    # The stop leaves no process (the restarted Worker and every executor included), no port, no
    # pid file, and no record that submit_spark.sh could take for a running job server.
    still_running = [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert still_running == [], still_running
    assert ports_still_held(ports, processes, cluster.state_dir) == {}
    assert not list((cluster.state_dir / "pid").glob("*.pid"))
    assert not any(
        p for p in psutil.process_iter(["cmdline"]) if str(cluster.state_dir) in " ".join(p.info["cmdline"] or [])
    ), "a process of the cluster outlived stop"
    assert _status(cluster).returncode == 1


@pytest.mark.timeout(1200, func_only=True)
def test_an_interrupted_submit_cancels_its_job_and_resume_finishes_it(spark_cluster, big_tree, tmp_path):
    images, reference = big_tree
    out = tmp_path / "out"
    args = spark_cluster.submit_args(["--input", str(images), "--output_dir", str(out), "--job_name", "interrupted"])
    job = subprocess.Popen(
        [*args, *BIG_TREE_FLAGS], env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: any(out.glob("shards/*/.tmp-*")), timeout=300, interval=0.1, what="a shard being converted")
        job.send_signal(signal.SIGTERM)
        log, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 143, log[-4000:]
    assert "interrupted: cancelled job(s) interrupted_" in log, log[-4000:]
    wait_for(
        lambda: _jobs(spark_cluster)["interrupted"] == beam_job_api_pb2.JobState.CANCELLED,
        timeout=60,
        what="the job cancelled at the job server",
    )
    wait_for(lambda: not spark_cluster.overview()["activeapps"], timeout=120, what="the Spark application's end")
    assert not (out / "dataset_info.json").exists(), "nothing under a final name"
    run_script([*args, "--resume", *BIG_TREE_FLAGS], timeout=600)
    assert_same_output(out, reference)


@pytest.mark.timeout(900, func_only=True)
def test_two_submits_at_once_both_finish_the_second_on_a_job_server_of_its_own(
    spark_cluster, local_output, photo_tree, tmp_path
):
    """The cluster's job server runs one Spark context at a time (Spark allows one per JVM): a
    second job submitted meanwhile failed at once. The second submit now starts its own."""
    jobs = [
        subprocess.Popen(
            spark_cluster.submit_args(["--input", str(photo_tree), "--output_dir", str(tmp_path / name), *JOB_FLAGS]),
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    logs = [job.communicate(timeout=600)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], logs
    assert sum("is running another job, and runs one at a time: starting one for this job" in log for log in logs) == 1
    for name in ("a", "b"):
        assert_same_output(tmp_path / name, local_output)


def test_submit_checks_the_endpoint_and_the_worker_pool_before_the_job(spark_cluster, tmp_path):
    """A port that speaks no gRPC as --job_endpoint, or a worker pool that is not there, hung the job
    or failed it after minutes with a Java trace: each is one line before anything runs."""
    base = [str(LAUNCH / "submit_spark.sh"), "--spark_master", spark_cluster.spark_master]
    job = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o")]
    web_ui = f"127.0.0.1:{spark_cluster.webui_port}"
    proc = run_script([*base, "--job_endpoint", web_ui, *job], timeout=120, check=False)
    assert proc.returncode == 2 and f"no Beam job server answers at --job_endpoint {web_ui}" in proc.stderr
    nothing = f"127.0.0.1:{SparkCluster(tmp_path).master_port}"  # a free port
    proc = run_script([*base, "--environment_config", nothing, *job], timeout=120, check=False)
    assert proc.returncode == 2 and f"no SDK worker pool listens at --environment_config {nothing}" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_failed_start_ends_in_one_line_and_leaves_nothing(spark_job_server_jar, tmp_path):
    """A start whose Master is not up in time (--timeout 1) stopped what it started, then waited
    for ever on the Master it had launched itself."""
    cluster = SparkCluster(tmp_path / "spark")
    proc = run_script([*cluster.args("start"), "--timeout", "1"], timeout=120, check=False)
    assert proc.returncode == 2 and "error: the Master did not come up" in proc.stderr, proc.stderr
    assert not [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(cluster.state_dir) in " ".join(p.info["cmdline"] or [])
    ]
    assert not port_open(cluster.master_port) and not port_open(cluster.webui_port)


def test_status_of_a_state_dir_with_no_cluster_says_so(tmp_path):
    proc = run_script(
        [str(LAUNCH / "spark_cluster.sh"), "status", "--state_dir", str(tmp_path)], timeout=60, check=False
    )
    assert proc.returncode == 1 and proc.stdout.strip() == f"Spark: no cluster was started with state dir {tmp_path}"


def test_more_cores_than_the_machine_has_are_allowed_as_spark_allows_them_but_said(tmp_path):
    proc = run_script(
        [str(LAUNCH / "spark_cluster.sh"), "status", "--state_dir", str(tmp_path), "--cores", "99"],
        timeout=60,
        check=False,
    )
    assert f"warning: --cores 99 is more than the {os.cpu_count()} cores here" in proc.stderr, proc.stderr
    assert proc.returncode == 1  # then on as asked: no cluster in that state dir
    quiet = run_script(
        [str(LAUNCH / "spark_cluster.sh"), "status", "--state_dir", str(tmp_path), "--cores", "1"],
        timeout=60,
        check=False,
    )
    assert "warning" not in quiet.stderr


def test_submit_refuses_a_master_that_is_not_there_in_one_line(tmp_path):
    port = SparkCluster(tmp_path).master_port  # free: nothing listens there
    proc = run_script(
        [str(LAUNCH / "submit_spark.sh"), "--spark_master", f"127.0.0.1:{port}", "--input", "x", "--output_dir", "y"],
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"error: no Spark Master answers at spark://127.0.0.1:{port}: start a cluster "
            "(launch/spark_cluster.sh start) or pass --spark_master HOST:PORT"
        )
    ), proc.stderr


def test_the_dry_run_prints_the_spark_command_and_checks_the_arguments(tmp_path):
    proc = run_script(
        [str(LAUNCH / "submit_spark.sh"), "--dry-run", "--input", str(tmp_path), "--output_dir", str(tmp_path / "o")],
        timeout=60,
    )
    command = proc.stdout.strip()
    assert "-m beam_jobs --runner=SparkRunner --spark_master_url=spark://127.0.0.1:7077" in command, command
    assert (
        "--environment_type=EXTERNAL --environment_config=127.0.0.1:50001 --environment_cache_millis=10000" in command
    )
    assert "ok: the job arguments are valid" in proc.stderr
    bad = run_script(
        [str(LAUNCH / "submit_spark.sh"), "--dry-run", "--input", str(tmp_path), "--output_dir", str(tmp_path / "o")]
        + ["--image_size", "-3"],
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "image_size" in bad.stderr, bad.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["start", "--spark_version", "2.4.8"], "--spark_version must be a Spark 3 release"),
        (["start", "--master_port", "7077", "--webui_port", "7077"], "--master_port and --webui_port are both 7077"),
        (["start", "--worker_memory", "lots"], "--worker_memory must be a size"),
        (["start", "--workers", "0"], "--workers must be at least 1"),
        (["restart"], "unknown command 'restart'"),
    ],
)
def test_spark_cluster_refuses_bad_options_in_one_line(tmp_path, args, message):
    proc = run_script([str(LAUNCH / "spark_cluster.sh"), *args, "--state_dir", str(tmp_path)], timeout=60, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir()), "nothing was started or written"


def test_spark_version_default_is_the_job_servers():
    pom = (LAUNCH / "spark_job_server" / "pom.xml").read_text()
    assert f"<spark.version>{SPARK_VERSION}</spark.version>" in pom

"""The launch scripts refuse bad starts with one clear line: an option without its value, Java or
Maven missing, a port in use, a cluster of another Flink minor version than the job server's."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess

import pytest

from tests.cluster.conftest import FLINK_VERSION, LAUNCH, REPO_ROOT, free_port, job_env

pytestmark = [pytest.mark.cluster]

# Every option that takes a value, per script (and the command word flink_cluster.sh needs).
VALUE_OPTIONS = {
    ("flink_cluster.sh", "status"): [
        "--flink_version", "--beam_runner_version", "--state_dir", "--rest_port", "--rpc_port",
        "--worker_pool_port", "--taskmanagers", "--slots", "--taskmanager_memory", "--restart_attempts",
        "--restart_delay", "--heartbeat_timeout_ms", "--timeout"],
    ("submit_flink.sh", None): [
        "--flink_master", "--parallelism", "--environment_type", "--environment_config", "--sdk_image",
        "--flink_version", "--beam_runner_version", "--flink_job_server_jar", "--job_module"],
    ("run_portable.sh", None): [
        "--job_endpoint", "--worker_pool", "--job_port", "--worker_pool_port", "--log_dir", "--job_module"],
    ("submit_dataflow.sh", None): [
        "--project", "--region", "--temp_location", "--staging_location", "--setup_file",
        "--sdk_container_image", "--machine_type", "--num_workers", "--max_num_workers", "--job_name",
        "--service_account", "--job_module"],
}


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env or job_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess, script: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[{script}] error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("script, command, option", [
    (script, command, option) for (script, command), options in VALUE_OPTIONS.items() for option in options])
@pytest.mark.parametrize("then", [[], ["--dry-run"]], ids=["last", "before-another-option"])
def test_an_option_without_its_value_is_one_line_naming_it(script, command, option, then):
    # It was "$2: unbound variable" (or the next option taken as the value).
    proc = _run([str(LAUNCH / script), *([command] if command else []), option, *then])
    line = _one_error_line(proc, script)
    assert f"{option} needs a value" in line


@pytest.fixture
def path_without(tmp_path):
    """A PATH that holds every program of this one except the named ones, and no JAVA_HOME."""
    def make(*missing: str) -> dict[str, str]:
        env = job_env()
        env.pop("JAVA_HOME", None)
        shadow = tmp_path / ("bin-without-" + "-".join(missing))
        shadow.mkdir()
        for folder in env["PATH"].split(os.pathsep):
            if not os.path.isdir(folder):
                continue
            for entry in os.scandir(folder):
                target = shadow / entry.name
                if entry.name not in missing and not target.exists() and os.access(entry.path, os.X_OK):
                    target.symlink_to(entry.path)
        env["PATH"] = str(shadow)
        env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "empty-cache")  # nothing built or installed yet
        env.pop("FLINK_JOB_SERVER_JAR", None)
        return env
    return make


def test_flink_cluster_start_without_java_is_one_line(path_without, tmp_path):
    proc = _run([str(LAUNCH / "flink_cluster.sh"), "start", "--state_dir", str(tmp_path / "state"),
                 "--rest_port", str(free_port())], env=path_without("java"))
    line = _one_error_line(proc, "flink_cluster.sh")
    assert "Java is missing" in line and "JAVA_HOME" in line
    assert not (tmp_path / "empty-cache").exists()  # it stopped before downloading anything


def test_flink_cluster_fetch_without_maven_is_one_line(path_without, tmp_path):
    proc = _run([str(LAUNCH / "flink_cluster.sh"), "fetch"], env=path_without("mvn"))
    line = _one_error_line(proc, "flink_cluster.sh")
    assert "Maven is missing" in line and "--flink_job_server_jar" in line
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.parametrize("option", ["--rest_port", "--rpc_port", "--worker_pool_port"])
def test_flink_cluster_start_on_a_port_in_use_is_one_line(option, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = {"--rest_port": free_port(), "--rpc_port": free_port(), "--worker_pool_port": free_port(), option: port}
        proc = _run([str(LAUNCH / "flink_cluster.sh"), "start", "--state_dir", str(tmp_path / "state"),
                     *[x for kv in ports.items() for x in map(str, kv)]])
    line = _one_error_line(proc, "flink_cluster.sh")
    assert f"port {port} " in line and option in line
    assert not (tmp_path / "state" / "pid").exists()  # nothing was started


def test_submit_flink_refuses_a_cluster_of_another_minor_version(flink_cluster, tmp_path):
    # The job server for 1.20 would fail on this 1.19 cluster with a Java stack trace; the script
    # asks the REST API first, before building or starting anything.
    env = job_env()
    env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "empty-cache")
    proc = _run([str(LAUNCH / "submit_flink.sh"), "--flink_master", flink_cluster.flink_master,
                 "--flink_version", "1.20", "--input", "x", "--output_dir", str(tmp_path / "out")], env=env)
    line = _one_error_line(proc, "submit_flink.sh")
    assert f"runs Flink {FLINK_VERSION}" in line and "--flink_version 1.19" in line
    assert not (tmp_path / "empty-cache").exists() and not (tmp_path / "out").exists()


def test_submit_flink_refuses_a_job_server_built_for_another_minor_version():
    proc = _run([str(LAUNCH / "submit_flink.sh"), "--dry-run", "--flink_version", "1.20",
                 "--flink_job_server_jar", "/jars/beam-runners-flink-1.19-job-server-2.62.0.jar",
                 "--input", "x", "--output_dir", "y"])
    line = _one_error_line(proc, "submit_flink.sh")
    assert "built for Flink 1.19" in line


def test_submit_flink_without_a_cluster_is_one_line(tmp_path):
    proc = _run([str(LAUNCH / "submit_flink.sh"), "--flink_master", f"127.0.0.1:{free_port()}",
                 "--input", "x", "--output_dir", str(tmp_path / "out")])
    line = _one_error_line(proc, "submit_flink.sh")
    assert "no Flink REST API answers" in line and "flink_cluster.sh start" in line


@pytest.mark.parametrize("script", ["submit_flink.sh", "run_portable.sh"])
def test_dry_runs_run_the_jobs_own_argument_checks(script):
    proc = _run([str(LAUNCH / script), "--dry-run", "--input", "x", "--output_dir", "y", "--num_shards=-3"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("images-to-tfrecords: error: --num_shards")


def test_the_pom_pins_the_pairing_the_scripts_default_to():
    pom = (LAUNCH / "flink_job_server" / "pom.xml").read_text()
    assert f"<flink.version>{FLINK_VERSION}</flink.version>" in pom
    assert "<flink.minor>1.19</flink.minor>" in pom and "<beam.version>2.62.0</beam.version>" in pom
    help_text = _run([str(LAUNCH / "flink_cluster.sh"), "--help"]).stdout
    assert f"[{FLINK_VERSION}]" in help_text and "[2.62.0]" in help_text
    assert pathlib.Path(LAUNCH / "flink_job_server" / "pom.xml").is_file()

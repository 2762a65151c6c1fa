"""The launch scripts refuse bad starts with one clear line: an option without its value, Java or
Maven missing, a port in use, a cluster of another Flink minor version than the job server's."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.cluster.conftest import FLINK_VERSION, LAUNCH, REPO_ROOT, free_port, job_env

pytestmark = [pytest.mark.cluster]

# Every option that takes a value, per script (and the command word flink_cluster.sh needs).
VALUE_OPTIONS = {
    ("flink_cluster.sh", "status"): [
        "--flink_version",
        "--beam_runner_version",
        "--state_dir",
        "--rest_port",
        "--rpc_port",
        "--worker_pool_port",
        "--job_server_port",
        "--taskmanagers",
        "--slots",
        "--taskmanager_memory",
        "--restart_attempts",
        "--restart_delay",
        "--heartbeat_timeout_ms",
        "--timeout",
    ],
    ("submit_flink.sh", None): [
        "--flink_master",
        "--parallelism",
        "--environment_type",
        "--environment_config",
        "--sdk_image",
        "--flink_version",
        "--beam_runner_version",
        "--flink_job_server_jar",
        "--job_endpoint",
        "--job_module",
    ],
    ("run_portable.sh", None): [
        "--job_endpoint",
        "--worker_pool",
        "--job_port",
        "--worker_pool_port",
        "--log_dir",
        "--job_module",
    ],
    ("submit_dataflow.sh", None): [
        "--project",
        "--region",
        "--temp_location",
        "--staging_location",
        "--setup_file",
        "--sdk_container_image",
        "--machine_type",
        "--num_workers",
        "--max_num_workers",
        "--job_name",
        "--service_account",
        "--job_module",
    ],
}


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The timeout only guards a hang: a cold, busy machine may take a while to start a script.
    return subprocess.run(args, env=env or job_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess, script: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[{script}] error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "script, command, option",
    [(script, command, option) for (script, command), options in VALUE_OPTIONS.items() for option in options],
)
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
    proc = _run(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "start",
            "--state_dir",
            str(tmp_path / "state"),
            "--rest_port",
            str(free_port()),
        ],
        env=path_without("java"),
    )
    line = _one_error_line(proc, "flink_cluster.sh")
    assert "Java is missing" in line and "JAVA_HOME" in line
    assert not (tmp_path / "empty-cache").exists()  # it stopped before downloading anything


def test_flink_cluster_fetch_without_maven_is_one_line(path_without, tmp_path):
    proc = _run([str(LAUNCH / "flink_cluster.sh"), "fetch"], env=path_without("mvn"))
    line = _one_error_line(proc, "flink_cluster.sh")
    assert "Maven is missing" in line and "--flink_job_server_jar" in line
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.parametrize("option", ["--rest_port", "--rpc_port", "--worker_pool_port", "--job_server_port"])
def test_flink_cluster_start_on_a_port_in_use_is_one_line(option, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = {
            "--rest_port": free_port(),
            "--rpc_port": free_port(),
            "--worker_pool_port": free_port(),
            "--job_server_port": free_port(),
            option: port,
        }
        proc = _run(
            [
                str(LAUNCH / "flink_cluster.sh"),
                "start",
                "--state_dir",
                str(tmp_path / "state"),
                *[x for kv in ports.items() for x in map(str, kv)],
            ]
        )
    line = _one_error_line(proc, "flink_cluster.sh")
    assert f"port {port} " in line and option in line
    assert not (tmp_path / "state" / "pid").exists()  # nothing was started


def test_submit_flink_refuses_a_cluster_of_another_minor_version(flink_cluster, tmp_path):
    # The job server for 1.20 would fail on this 1.19 cluster with a Java stack trace; the script
    # asks the REST API first, before building or starting anything.
    env = job_env()
    env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "empty-cache")
    proc = _run(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            flink_cluster.flink_master,
            "--flink_version",
            "1.20",
            "--input",
            "x",
            "--output_dir",
            str(tmp_path / "out"),
        ],
        env=env,
    )
    line = _one_error_line(proc, "submit_flink.sh")
    assert f"runs Flink {FLINK_VERSION}" in line and "--flink_version 1.19" in line
    assert not (tmp_path / "empty-cache").exists() and not (tmp_path / "out").exists()


def test_submit_flink_refuses_a_job_server_built_for_another_minor_version(tmp_path):
    jar = _jar(tmp_path / "beam-runners-flink-1.19-job-server-2.62.0.jar")
    proc = _run(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--dry-run",
            "--flink_version",
            "1.20",
            "--flink_job_server_jar",
            jar,
            "--input",
            "x",
            "--output_dir",
            "y",
        ]
    )
    line = _one_error_line(proc, "submit_flink.sh")
    assert "built for Flink 1.19" in line


def test_submit_flink_without_a_cluster_is_one_line(tmp_path):
    proc = _run(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            f"127.0.0.1:{free_port()}",
            "--input",
            "x",
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
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


# --- A stand-in Flink distribution: the daemons are small Python processes whose command lines name
# Flink's entrypoint classes (as the real JVMs' do); the JobManager answers REST /overview. Lets the
# start/stop/status logic of flink_cluster.sh be tested in seconds, without a JVM.

_FAKE_DAEMON_SH = """#!/usr/bin/env bash
kind=$1 class=$2 action=$3
[[ "$action" == start ]] || exit 0
mkdir -p "$FLINK_PID_DIR" "$FLINK_LOG_DIR"
"$PYTHON" "$(dirname "$0")/fake_daemon.py" "$class" "$kind" \
  >>"$FLINK_LOG_DIR/flink-test-$kind-0-host.log" 2>&1 </dev/null &
echo $! >>"$FLINK_PID_DIR/flink-test-$kind.pid"
"""

_FAKE_DAEMON_PY = """
import http.server, json, os, pathlib, re, sys, time
cls, kind = sys.argv[1], sys.argv[2]
conf = pathlib.Path(os.environ["FLINK_CONF_DIR"], "config.yaml").read_text()
value = lambda key: re.search("^" + re.escape(key) + ": (.*)$", conf, re.M).group(1)
mode = os.environ.get("FAKE_FLINK", "")
if kind == "taskexecutor":
    time.sleep(600)
    sys.exit()
if mode == "jm-dies":
    print("2026 INFO starting")
    print("2026 ERROR Could not start cluster entrypoint StandaloneSessionClusterEntrypoint.")
    print("Caused by: java.net.BindException: Could not start rest endpoint on any port (fake)")
    sys.exit(1)
pid_dir = pathlib.Path(os.environ["FLINK_PID_DIR"])
if mode == "jm-waits":  # binds only once the test says so (after it let another server take the port)
    go = pathlib.Path(os.environ["FLINK_CONF_DIR"]).parent / "go"
    while not go.exists():
        time.sleep(0.1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        pids = [p for f in pid_dir.glob("*taskexecutor.pid") for p in f.read_text().split()]
        tms = [] if mode == "tm-never" else pids
        slots = int(value("taskmanager.numberOfTaskSlots"))
        body = json.dumps({"taskmanagers": len(tms), "slots-total": len(tms) * slots, "flink-version": "1.19.3"})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass

try:
    server = http.server.HTTPServer(("127.0.0.1", int(value("rest.port"))), Handler)
except OSError as e:  # as Flink's JobManager: the bind error in its log, then exit
    print("2026 ERROR Could not start cluster entrypoint StandaloneSessionClusterEntrypoint.")
    print(f"Caused by: java.net.BindException: Could not start rest endpoint on any port ({e})", flush=True)
    sys.exit(1)
server.serve_forever()
"""


def _pids_under(folder: pathlib.Path) -> list[int]:
    return [int(p) for f in folder.rglob("*.pid") for p in f.read_text().split() if p.strip().isdigit()]


def _alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _ours(pid: int) -> bool:
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in cmdline for mark in (b"fake_daemon.py", b"sdk_worker_pool.py", b"org.apache.flink."))


@pytest.fixture
def fake_flink(tmp_path):
    """(env, run): an environment whose cache holds the stand-in Flink 1.19.3, and a runner of
    flink_cluster.sh with it. Every process it starts is killed at the end, whatever happened."""
    home = tmp_path / "cache" / f"flink-{FLINK_VERSION}" / "pyflink"
    (home / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "conf").mkdir()
    (home / "lib" / f"flink-dist-{FLINK_VERSION}.jar").write_bytes(b"PK\x03\x04")
    (home / "conf" / "config.yaml").write_text("env:\n  java:\n    opts:\n      all: -Dfake=1\n")
    (home / "conf" / "log4j.properties").write_text("")
    (home / "conf" / "logback.xml").write_text("")
    (home / "bin" / "fake_daemon.py").write_text(_FAKE_DAEMON_PY)
    (home / "bin" / "fake-daemon.sh").write_text(_FAKE_DAEMON_SH)
    (home / "bin" / "jobmanager.sh").write_text(
        '#!/usr/bin/env bash\nexec "$(dirname "$0")/fake-daemon.sh" standalonesession '
        'org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint "$@"\n'
    )
    (home / "bin" / "taskmanager.sh").write_text(
        '#!/usr/bin/env bash\nexec "$(dirname "$0")/fake-daemon.sh" taskexecutor '
        'org.apache.flink.runtime.taskexecutor.TaskManagerRunner "$@"\n'
    )
    for script in (home / "bin").glob("*.sh"):
        script.chmod(0o755)
    env = job_env()
    env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "cache")

    def run(command: str, *args: str, cwd=None, extra_env=None) -> subprocess.CompletedProcess:
        if command == "start" and "--job_server_port" not in args:
            args = (*args, "--job_server_port", "0")  # a Java job server needs the real Flink
        return subprocess.run(
            [str(LAUNCH / "flink_cluster.sh"), command, *args],
            env={**env, **(extra_env or {})},
            cwd=cwd or REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

    try:
        yield env, run
    finally:
        for pid in _pids_under(tmp_path):
            if _ours(pid):
                os.kill(pid, 9)


def _ports(*names: str) -> list[str]:
    return [x for name in names for x in (name, str(free_port()))]


def test_flink_cluster_start_twice_on_one_state_dir_is_refused(fake_flink, tmp_path):
    # It overwrote the pid files: the first cluster (and its worker pool) could no longer be stopped.
    _, run = fake_flink
    state = str(tmp_path / "state")
    first = run("start", "--state_dir", state, *_ports("--rest_port", "--rpc_port"), "--worker_pool_port", "0")
    assert first.returncode == 0, first.stderr
    pids = _pids_under(tmp_path / "state")
    assert len(pids) == 2 and all(map(_alive, pids))
    second = run("start", "--state_dir", state, *_ports("--rest_port", "--rpc_port"), "--worker_pool_port", "0")
    line = _one_error_line(second, "flink_cluster.sh")
    assert "already running" in line and "stop it first" in line
    assert sorted(_pids_under(tmp_path / "state")) == sorted(pids)
    assert run("stop", "--state_dir", state).returncode == 0
    assert not any(map(_alive, pids))


def test_flink_cluster_stop_kills_only_its_own_processes(fake_flink, tmp_path):
    # A stale pid file (a crash, a reboot) may name someone else's process by now.
    _, run = fake_flink
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        pid_dir = tmp_path / "state" / "pid"
        pid_dir.mkdir(parents=True)
        (pid_dir / "flink-x-standalonesession.pid").write_text(f"{stranger.pid}\n")
        (pid_dir / "worker-pool.pid").write_text(f"{stranger.pid}\n")
        proc = run("stop", "--state_dir", str(tmp_path / "state"))
        assert proc.returncode == 0, proc.stderr
        assert stranger.poll() is None, "stop killed a process that is not the cluster's"
        assert not list(pid_dir.glob("*.pid"))
    finally:
        stranger.kill()
        stranger.wait()


def test_flink_cluster_relative_state_dir_is_made_absolute(fake_flink, tmp_path):
    _, run = fake_flink
    (tmp_path / "elsewhere").mkdir()
    proc = run(
        "start", "--state_dir", "state", *_ports("--rest_port", "--rpc_port"), "--worker_pool_port", "0", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    config = (tmp_path / "state" / "conf" / "config.yaml").read_text()
    assert f"io.tmp.dirs: {tmp_path}/state/tmp" in config
    pids = _pids_under(tmp_path / "state")
    assert pids and all(map(_alive, pids))
    # From another directory, the same relative name is another state dir: nothing runs there.
    proc = run("stop", "--state_dir", "state", cwd=tmp_path / "elsewhere")
    assert proc.returncode == 0 and "nothing to stop" in proc.stderr, proc.stderr
    assert all(map(_alive, pids))
    proc = run("stop", "--state_dir", "../state", cwd=tmp_path / "elsewhere")
    assert proc.returncode == 0 and "stopped" in proc.stderr, proc.stderr
    assert not any(map(_alive, pids))


def test_flink_cluster_remembers_its_ports_and_prints_the_submit_flags(fake_flink, tmp_path):
    _, run = fake_flink
    state = str(tmp_path / "state")
    rest, rpc, pool = free_port(), free_port(), free_port()
    proc = run(
        "start",
        "--state_dir",
        state,
        "--rest_port",
        str(rest),
        "--rpc_port",
        str(rpc),
        "--worker_pool_port",
        str(pool),
        "--slots",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 slots, worker pool" in proc.stderr  # not "3 slots , worker pool"
    assert (
        f"launch/submit_flink.sh --flink_master 127.0.0.1:{rest} --environment_config 127.0.0.1:{pool}" in proc.stderr
    ), proc.stderr
    status = run("status", "--state_dir", state)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"Flink at http://127.0.0.1:{rest}" in status.stdout
    assert "worker pool: running" in status.stdout and f"port {pool})" in status.stdout
    pids = _pids_under(tmp_path / "state")
    assert len(pids) == 3
    # A part that start started and that is gone makes status fail: a job submitted now would not run.
    (pool_pid,) = [int(p) for p in (tmp_path / "state" / "pid" / "worker-pool.pid").read_text().split()]
    os.kill(pool_pid, signal.SIGKILL)
    wait_for_death = time.monotonic() + 30
    while _alive(pool_pid) and time.monotonic() < wait_for_death:
        time.sleep(0.1)
    status = run("status", "--state_dir", state)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "worker pool: not running" in status.stdout and "down: the worker pool" in status.stdout
    assert run("stop", "--state_dir", state).returncode == 0
    assert not any(map(_alive, pids))
    assert not port_in_use(rest) and not port_in_use(pool)
    assert run("status", "--state_dir", state).returncode == 1


def port_in_use(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_interrupting_flink_cluster_start_stops_what_it_started(fake_flink, tmp_path, signum):
    env, _ = fake_flink
    rest = free_port()
    start = subprocess.Popen(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "start",
            "--state_dir",
            str(tmp_path / "state"),
            "--rest_port",
            str(rest),
            *_ports("--rpc_port"),
            "--worker_pool_port",
            "0",
            "--job_server_port",
            "0",
            "--timeout",
            "600",
        ],
        env={**env, "FAKE_FLINK": "tm-never"},
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and bash
        # cannot trap a signal ignored at its start: give the script the default a terminal gives.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Generous, and well inside the script's own --timeout: a start that gave up waiting for the
        # TaskManager (tm-never) before the signal would not test the interruption.
        deadline = time.monotonic() + 300
        while len(_pids_under(tmp_path / "state")) < 2:  # the JobManager and the TaskManager run
            assert time.monotonic() < deadline and start.poll() is None, "start did not get that far"
            time.sleep(0.2)
        pids = _pids_under(tmp_path / "state")
        start.send_signal(signum)
        _, err = start.communicate(timeout=300)
    finally:
        if start.poll() is None:
            start.kill()
    assert start.returncode != 0, err
    assert "interrupted; stopping what was started" in err
    assert not any(map(_alive, pids)), "start left daemons running"


def test_a_jobmanager_that_dies_ends_the_wait_with_its_error(fake_flink, tmp_path):
    _, run = fake_flink
    began = time.monotonic()
    proc = run(
        "start",
        "--state_dir",
        str(tmp_path / "state"),
        *_ports("--rest_port", "--rpc_port"),
        "--worker_pool_port",
        "0",
        "--timeout",
        "600",
        extra_env={"FAKE_FLINK": "jm-dies"},
    )
    # The evidence is the script's own line: it saw the JobManager exit, rather than running out of
    # its --timeout (which would take 600 s, and say "timed out after").
    assert "exited before 127.0.0.1:" in proc.stderr and "timed out after" not in proc.stderr, proc.stderr
    assert time.monotonic() - began < 300, "waited for the port of a JobManager that had died"
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[flink_cluster.sh] error: the JobManager did not come up"), proc.stderr
    assert "Caused by: java.net.BindException" in last


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--rest_port", "0", "port number from 1 to 65535"),
        ("--rpc_port", "70000", "port number from 1 to 65535"),
        ("--worker_pool_port", "65536", "port number from 0 to 65535"),
        ("--job_server_port", "x", "port number from 0 to 65535"),
        ("--slots", "0", "at least 1"),
        ("--taskmanagers", "0", "at least 1"),
        ("--slots", "abc", "expected a number (got 'abc')"),
        ("--flink_version", "1.19", "X.Y.Z"),
    ],
)
def test_flink_cluster_checks_ranges_naming_the_option(option, value, says, fake_flink, tmp_path):
    # Free ports and the stand-in Flink: a script that did not check would start nothing real.
    _, run = fake_flink
    ports = dict(zip(*[iter(_ports("--rest_port", "--rpc_port", "--worker_pool_port"))] * 2, strict=True))
    ports[option] = value
    proc = run("start", "--state_dir", str(tmp_path / "state"), *[x for kv in ports.items() for x in kv])
    line = _one_error_line(proc, "flink_cluster.sh")
    assert line.startswith(f"[flink_cluster.sh] error: {option} ") and says in line, line
    assert not (tmp_path / "state").exists()


def _jar(path: pathlib.Path, data: bytes = b"PK\x03\x04rest of a zip") -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("kind", ["missing", "not-a-zip"])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_bad_job_server_jar_is_one_line_before_anything_else(kind, via, tmp_path):
    jar = tmp_path / "beam-runners-flink-1.19-job-server-2.62.0.jar"
    if kind == "not-a-zip":
        jar.write_text("<html>404 Not Found</html>")
    env = job_env()
    env["FLINK_JOB_SERVER_JAR"] = str(jar) if via == "env" else ""
    named = "FLINK_JOB_SERVER_JAR" if via == "env" else "--flink_job_server_jar"
    flag = ["--flink_job_server_jar", str(jar)] if via == "flag" else []
    for args in (["--dry-run"], ["--flink_master", f"127.0.0.1:{free_port()}"]):
        proc = _run([str(LAUNCH / "submit_flink.sh"), *args, *flag, "--input", "x", "--output_dir", "y"], env=env)
        line = _one_error_line(proc, "submit_flink.sh")
        assert named in line and ("no such file" if kind == "missing" else "not a jar") in line, line
    if via == "env":
        env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "empty-cache")
        line = _one_error_line(_run([str(LAUNCH / "flink_cluster.sh"), "fetch"], env=env), "flink_cluster.sh")
        assert named in line
        assert not (tmp_path / "empty-cache").exists()


def test_submit_flink_checks_the_job_arguments_before_the_cluster():
    proc = _run(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            f"127.0.0.1:{free_port()}",
            "--input",
            "x",
            "--output_dir",
            "y",
            "--num_shards=-3",
        ]
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("images-to-tfrecords: error: --num_shards"), proc.stderr


class _FakeRest:
    """A Flink REST API on loopback: /overview, /jobs/overview (a job appears once `submitted` is
    set), and the PATCH requests it got."""

    def __init__(self, slots: int) -> None:
        rest = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/overview":
                    body = {"flink-version": FLINK_VERSION, "slots-total": slots, "taskmanagers": 1}
                else:
                    # Its job, and one that someone else submitted to the same cluster meanwhile.
                    jobs = [
                        {"jid": "0123abcd", "name": "sleepy", "state": "RUNNING"},
                        {"jid": "4567cdef", "name": "someone-elses", "state": "RUNNING"},
                    ]
                    body = {"jobs": jobs if rest.submitted.is_set() else []}
                self.send_response(200)
                self.end_headers()
                self.wfile.write(json.dumps(body).encode())

            def do_PATCH(self):
                rest.patches.append(self.path)
                self.send_response(202)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.submitted = threading.Event()
        self.patches: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.master = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_rest():
    servers = []

    def make(slots: int) -> _FakeRest:
        servers.append(_FakeRest(slots))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_submit_flink_refuses_more_parallelism_than_the_clusters_slots(fake_rest, tmp_path):
    # The job would wait for slots forever, RUNNING, with no word.
    rest = fake_rest(2)
    env = job_env()
    env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "empty-cache")
    proc = _run(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            rest.master,
            "--parallelism",
            "3",
            "--input",
            "x",
            "--output_dir",
            "y",
        ],
        env=env,
    )
    line = _one_error_line(proc, "submit_flink.sh")
    assert "--parallelism 3" in line and "2 task slots" in line
    assert not (tmp_path / "empty-cache").exists()


# A stand-in for `java -jar JOB_SERVER_JAR ...`: it listens on --job-port, as Beam's job server does.
_FAKE_JAVA = """#!{python}
import os, pathlib, socket, sys, time
port = int(sys.argv[sys.argv.index("--job-port") + 1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
pathlib.Path(os.environ["FAKE_JAVA_PID"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def test_interrupted_submit_flink_cancels_its_job(fake_rest, tmp_path):
    rest = fake_rest(2)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "sleepy_job.py").write_text(
        "import os, pathlib, time\npathlib.Path(os.environ['SLEEPY_MARK']).touch()\ntime.sleep(600)\n"
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text(_FAKE_JAVA.format(python=sys.executable))
    (tmp_path / "bin" / "java").chmod(0o755)
    env = job_env()
    env["PYTHONPATH"] = f"{tmp_path / 'mods'}{os.pathsep}{env['PYTHONPATH']}"
    env["SLEEPY_MARK"] = str(tmp_path / "started")
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    env["FAKE_JAVA_PID"] = str(tmp_path / "java.pid")
    env["IMAGES_TO_TFRECORDS_CACHE"] = str(tmp_path / "cache")
    jar = _jar(tmp_path / "beam-runners-flink-1.19-job-server-2.62.0.jar")
    submit = subprocess.Popen(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            rest.master,
            "--flink_job_server_jar",
            jar,
            "--job_module",
            "sleepy_job",
            "--input",
            "x",
            "--job_name",
            "sleepy",
        ],
        env=env,
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and submit.poll() is None, "the job never started"
            time.sleep(0.2)
        rest.submitted.set()
        submit.send_signal(signal.SIGTERM)
        _, err = submit.communicate(timeout=300)
    finally:
        if submit.poll() is None:
            os.killpg(submit.pid, signal.SIGKILL)
    assert submit.returncode == 143, err
    assert rest.patches == ["/jobs/0123abcd?mode=cancel"], err  # its own job only
    assert "cancelled Flink job(s) 0123abcd" in err
    # The job server that the script started for the job ends with it.
    java_pid = int((tmp_path / "java.pid").read_text())
    deadline = time.monotonic() + 30
    while _alive(java_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(java_pid), "submit_flink.sh left its job server running"


@pytest.mark.parametrize("option", ["--job_port", "--worker_pool_port"])
def test_run_portable_checks_its_ports(option, tmp_path):
    for value in ("0", "abc", "65536"):
        proc = _run([str(LAUNCH / "run_portable.sh"), "--dry-run", option, value, "--input", "x", "--output_dir", "y"])
        line = _one_error_line(proc, "run_portable.sh")
        assert f"{option} must be a port number" in line
    # gRPC binds with SO_REUSEPORT: the service would start beside this listener and the job hang.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _run(
            [
                str(LAUNCH / "run_portable.sh"),
                option,
                str(port),
                "--log_dir",
                str(tmp_path / "logs"),
                "--input",
                "x",
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )
    line = _one_error_line(proc, "run_portable.sh")
    assert f"port {port} " in line and option in line and "in use" in line
    assert not (tmp_path / "out").exists()


class _StrangerFlink:
    """Another cluster's REST API on a port: answers /overview as a healthy Flink would."""

    def __init__(self, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"taskmanagers": 4, "slots-total": 8, "flink-version": "1.19.3"}).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_rest_port_answered_by_another_cluster_is_not_taken_for_ours(fake_flink, tmp_path):
    # The port was free when start checked it; by the time the JobManager bound, another cluster
    # held it, and its REST API answered start's readiness checks.
    env, run = fake_flink
    rest = free_port()
    state = tmp_path / "state"
    start = subprocess.Popen(
        [
            str(LAUNCH / "flink_cluster.sh"),
            "start",
            "--state_dir",
            str(state),
            "--rest_port",
            str(rest),
            *_ports("--rpc_port"),
            "--worker_pool_port",
            "0",
            "--job_server_port",
            "0",
            "--timeout",
            "600",
        ],
        env={**env, "FAKE_FLINK": "jm-waits"},
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stranger = None
    try:
        deadline = time.monotonic() + 300
        while not list((state / "pid").glob("*standalonesession.pid")):  # its JobManager is starting
            assert time.monotonic() < deadline and start.poll() is None, "start did not get that far"
            time.sleep(0.1)
        stranger = _StrangerFlink(rest)
        (state / "go").write_text("")
        _, err = start.communicate(timeout=300)
        assert start.returncode == 2, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("[flink_cluster.sh] error: the JobManager did not come up"), err
        assert f"port {rest}" in last and "another process" in last, last
        assert "up: web UI" not in err
        assert not any(map(_alive, _pids_under(state))), "start left daemons running"
        # The other cluster is left alone, and status does not report it as this state dir's.
        assert stranger.thread.is_alive()
        status = run("status", "--state_dir", str(state))
        assert status.returncode == 1 and "not this state dir's" in status.stdout, status.stdout
    finally:
        if start.poll() is None:
            start.kill()
        if stranger is not None:
            stranger.close()


# Flink 1.19's names (ConfigOptions in flink-dist) of the waits a loopback cluster lengthens, and
# their values: a job failed on 2 busy cores with Pekko's "AskTimeoutException ... after [10000 ms]".
_BUSY_MACHINE_TIMEOUTS = {
    "pekko.ask.timeout": "60 s",
    "pekko.lookup.timeout": "60 s",
    "pekko.tcp.timeout": "60 s",
    "rest.connection-timeout": "60000",
    "rest.await-leader-timeout": "60000",
    "heartbeat.timeout": "30000",
}


def test_the_loopback_clusters_config_waits_as_long_as_a_busy_machine_needs(fake_flink, tmp_path):
    _, run = fake_flink
    state = tmp_path / "state"
    proc = run("start", "--state_dir", str(state), *_ports("--rest_port", "--rpc_port"), "--worker_pool_port", "0")
    assert proc.returncode == 0, proc.stderr
    lines = (state / "conf" / "config.yaml").read_text().splitlines()
    config = dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith("#"))
    assert {key: config.get(key) for key in _BUSY_MACHINE_TIMEOUTS} == _BUSY_MACHINE_TIMEOUTS
    assert run("stop", "--state_dir", str(state)).returncode == 0


@pytest.mark.slow
def test_a_real_jobmanager_takes_the_busy_machine_timeouts(flink_cluster):
    """The names are Flink 1.19's own: the running JobManager reports them in its configuration."""
    with urllib.request.urlopen(f"http://{flink_cluster.flink_master}/jobmanager/config", timeout=30) as response:
        config = {entry["key"]: entry["value"] for entry in json.load(response)}
    assert {key: config.get(key) for key in _BUSY_MACHINE_TIMEOUTS} == _BUSY_MACHINE_TIMEOUTS


@pytest.mark.slow
def test_a_flink_submit_keeps_beams_service_lines_off_the_console(flink_cluster, flink_job_server_jar, tmp_path):
    """Beam announced each start and stop of the Java job server at WARNING ("Really starting
    service at localhost:N with cmd: [java, -jar, ...]"): nothing a user acts on. submit_flink.sh
    starts the job server itself, its output in a log file; even -v (Beam's INFO lines, and the
    job's counters at the end) shows neither the service lines nor the server's output."""
    from tests.photos import make_test_tree

    images = tmp_path / "images"
    make_test_tree(images, num_images=9)
    args = [
        str(LAUNCH / "submit_flink.sh"),
        "--flink_master",
        flink_cluster.flink_master,
        "--environment_config",
        flink_cluster.worker_pool,
        "--parallelism",
        "2",
        "--flink_job_server_jar",
        flink_job_server_jar,
        "--input",
        str(images),
        "--image_size",
        "32",
        "--max_bad_fraction",
        "0.9",
    ]
    env = {**job_env(), "IMAGES_TO_TFRECORDS_CACHE": str(tmp_path / "cache")}  # the job server's log goes there
    done = subprocess.run(
        [*args, "--output_dir", str(tmp_path / "out"), "-v"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-4000:]
    assert "Really starting service" not in console and "Really destroying service" not in console, console[-4000:]
    assert "committed version 1" in console and "counters: " in console, console[-4000:]
    (log,) = (tmp_path / "cache" / "logs").glob("flink-job-server-*.log")
    assert f"(log: {log})" in console
    # The job server's own output (with -v Beam relayed it to the console too) is in the log only.
    assert "SLF4J" in log.read_text() and "SLF4J" not in console, log.read_text()[-3000:]

"""The command's warm workers: claimed once each, a cold start without them, and nothing left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from beam_jobs import warm_workers
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO


def _warm_processes(runner_pid: int) -> list[psutil.Process]:
    """The warm workers (and the process that forked them) started for the command ``runner_pid``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "--warm" in command and str(runner_pid) in command:
            found.append(process)
    return found


def test_a_waiting_worker_is_claimed_by_one_launcher_only(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "0.sock"))
    listener.listen(2)
    with listener:
        first = warm_workers._claim(str(tmp_path))  # pylint: disable=protected-access
        second = warm_workers._claim(str(tmp_path))  # pylint: disable=protected-access
        assert first is not None and second is None
        first.close()
    assert not list(tmp_path.iterdir()), "the claimed socket's name is gone: no later launcher tries it"


def test_a_launcher_with_no_worker_to_claim_starts_a_cold_one(tmp_path):
    """Without a waiting worker the launcher becomes local_worker.py; without the endpoints a runner
    hands a worker, Beam's harness then fails, naming the one it lacks."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_SERVICE_DESCRIPTOR")}
    done = subprocess.run(
        [sys.executable, "-m", warm_workers.LAUNCHER_MODULE, str(os.getpid()), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "CONTROL_API_SERVICE_DESCRIPTOR" in done.stderr, done.stderr[-2000:]


def test_a_claimed_worker_writes_to_its_launchers_streams_not_to_those_it_was_forked_with(tmp_path):
    """A warm worker is forked before the job's console filter takes stderr; once claimed, what it
    prints (here the harness's failure without a runner's endpoints) must go where a cold worker's
    would: to the launcher's stderr, which the runner gave it."""
    folder = tmp_path / "warm"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_SERVICE_DESCRIPTOR")}
    forked_with = tmp_path / "forked-with.txt"
    with forked_with.open("w") as stream:
        warm = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "beam_jobs.local_worker", "--warm", str(os.getpid()), str(folder / "0.sock")],
            cwd=REPO,
            env=env,
            stdout=stream,
            stderr=stream,
        )
    try:
        deadline = time.monotonic() + 120
        while not (folder / "0.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        launcher = subprocess.run(
            [sys.executable, "-m", warm_workers.LAUNCHER_MODULE, str(os.getpid()), str(folder)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        warm.wait(timeout=60)
    finally:
        if warm.poll() is None:
            warm.kill()
            warm.wait()
    assert launcher.returncode != 0 and "CONTROL_API_SERVICE_DESCRIPTOR" in launcher.stderr, launcher.stderr[-2000:]
    assert "CONTROL_API_SERVICE_DESCRIPTOR" not in forked_with.read_text(), "nothing went past the launcher's stderr"


def test_the_launcher_command_quotes_a_folder_with_spaces():
    command = warm_workers.launcher_command("/venv/bin/python", 42, "/tmp/a b/itt-warm-x")
    assert command == f"/venv/bin/python -m {warm_workers.LAUNCHER_MODULE} 42 '/tmp/a b/itt-warm-x'"


def test_no_warm_workers_where_their_sockets_path_would_be_too_long(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert warm_workers.start_warm_workers(2) is None
    assert not list(deep.iterdir()), "nothing is left of the attempt"


def _command(photos, out, tmp, stderr=subprocess.PIPE):
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def _gone_soon(runner_pid: int, seconds: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _warm_processes(runner_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_refused_command_ends_its_unclaimed_warm_workers(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=4)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = _command(photos, photos / "out", tmp)  # an output folder inside the input: refused
    _, stderr = process.communicate(timeout=300)
    assert process.returncode != 0 and "inside" in stderr, stderr[-2000:]
    assert not _warm_processes(process.pid), "no warm worker outlives the command"
    assert not list(tmp.glob("itt-warm-*")), "their sockets' folder is removed"


@pytest.mark.slow
@pytest.mark.parametrize("when", ["while they import", "while they wait"])
def test_a_killed_command_takes_its_warm_workers_and_their_folder_with_it(tmp_path, when):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=400, seed=5)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = _command(photos, tmp_path / "out", tmp, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while not _warm_processes(process.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if when == "while they wait":
                while len(_warm_processes(process.pid)) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert _warm_processes(process.pid), "the command started warm workers"
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        assert not _gone_soon(process.pid, seconds=10), "the warm workers end with the command"
    assert "local_worker" not in log.read_text(), "nothing of theirs is printed after the command"
    deadline = time.monotonic() + 5
    while list(tmp.glob("itt-warm-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(tmp.glob("itt-warm-*")), "their sockets' folder is removed (Beam's own temp folder is Beam's)"


@pytest.mark.slow
@pytest.mark.parametrize("when", ["while the command imports", "while they wait"])
def test_ctrl_c_in_a_terminal_ends_the_command_with_one_line_and_leaves_nothing(tmp_path, when):
    """SIGINT to the command's whole process group, as a terminal's Ctrl-C sends it, while the
    command still imports Beam or once the warm workers wait: the command's own line, no traceback
    from any of its processes."""
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=400, seed=6)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(tmp_path / "out")],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while len(_warm_processes(process.pid)) < (1 if when == "while the command imports" else 3):
        assert time.monotonic() < deadline, "the command started no warm workers"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert not _gone_soon(process.pid), "no warm worker outlives the command"
    assert not list(tmp.glob("itt-warm-*")), "their sockets' folder is removed"

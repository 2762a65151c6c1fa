"""The tf.data service as a trainer and an operator meet it: every global step whole, and
launch/data_service.sh status naming the real worker process and its supervisor apart (killing
either one ends in the state that status then reports)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

import reader_fixtures
from test_reader_data_service import _ENV, _HERE, _alive, _script, _service, services  # noqa: F401

_WORKER = re.compile(r"^worker 0: running \(pid (\d+), 127\.0\.0\.1:(\d+); supervisor pid (\d+)\)$", re.M)


def _status(state_dir: pathlib.Path):
    return _script("status", "--state_dir", str(state_dir), check=False)


def _wait(what: str, condition, timeout: float = 120.0):
    """Polls `condition` until it returns something true; fails naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting for {what} after {timeout:g} s")


def _cmdline(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.slow
@pytest.mark.cluster
def test_status_names_the_worker_and_its_supervisor_and_tells_the_truth_after_kills(tmp_path: pathlib.Path) -> None:
    state_dir = tmp_path / "state"
    with _service(state_dir, 1):
        status = _status(state_dir)
        assert status.returncode == 0, status.stdout + status.stderr
        match = _WORKER.search(status.stdout)
        assert match, status.stdout
        worker, port, supervisor = int(match[1]), match[2], int(match[3])
        # The pid shown as the worker's is the server itself, listening at the shown port.
        assert "tfdata_readers.data_service_server --role worker" in _cmdline(worker)
        assert f"--port {port}" in _cmdline(worker) and worker != supervisor

        # A killed worker is restarted by its supervisor, and status shows the new one.
        os.kill(worker, signal.SIGKILL)

        def restarted():
            now = _WORKER.search(_status(state_dir).stdout)
            return now if now and int(now[1]) != worker else None

        again = _wait("the worker's restart", restarted)
        worker = int(again[1])
        assert int(again[3]) == supervisor and _alive(worker)

        # A killed supervisor leaves no unsupervised worker behind, and status says so.
        os.kill(supervisor, signal.SIGKILL)
        _wait("the worker to stop with its supervisor", lambda: not _alive(worker))
        status = _status(state_dir)
        assert status.returncode == 1 and "worker 0: not running" in status.stdout, status.stdout


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("workers", [1, 2])
def test_every_global_step_through_the_service_is_whole(services, tmp_path: pathlib.Path, workers: int) -> None:
    # 3 examples, per-replica batch 1, 2 replicas: a pass is 3 batches, so a step made of any two
    # consecutive batches would straddle a pass every third step, and hold one example twice in a
    # third of those. A step must be one worker's group of batches from one pass, as the plain
    # reader's step is one slice of one epoch.
    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (3, 1)}, image_size=(16, 16))
    expected = set(reader_fixtures.expected_keys(data_dir, "train"))
    address, _ = services[workers]
    out = tmp_path / "steps.json"
    proc = subprocess.run([sys.executable, str(_HERE / "data_service_steps_check.py"), str(out), str(data_dir),
                           address, "90", "1"], capture_output=True, text=True, env=_ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 90
    for number, replicas in enumerate(steps):
        keys = [k for batch in replicas for k in batch]
        assert [len(batch) for batch in replicas] == [1, 1], (number, replicas)  # a full batch per replica
        assert len(set(keys)) == len(keys), f"step {number} holds an example twice: {replicas}"
        assert set(keys) <= expected
    # At most once per pass, and every example still comes round.
    assert {k for replicas in steps for batch in replicas for k in batch} == expected

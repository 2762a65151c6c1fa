"""The tf.data service as an operator meets it: launch/data_service.sh status naming the real worker
process and its supervisor apart (killing either one ends in the state that status then reports).
That every global step through the service is whole is tested in test_reader_data_service.py,
on the services its other tests share."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import time

import pytest
from test_reader_data_service import _alive, _script, _service

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

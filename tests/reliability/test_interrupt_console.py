"""After Ctrl-C or a SIGTERM to the job's process group, the console shows the one line that says
how to resume, not the dying local runner's thread tracebacks or its workers' stderr."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO

pytestmark = pytest.mark.slow

_NOISE = ("Traceback", "Exception in thread", "RuntimeError", "grpc", "KeyboardInterrupt", 'File "')


def _converting(out: pathlib.Path) -> bool:
    """A shard is complete in the run's folder (its sidecar is written last)."""
    return any(out.glob("shards/*/.train-*.tfrecord.json"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm-group", "ctrl-c-group"])
def test_an_interrupt_to_the_process_group_shows_only_the_one_line(tmp_path: pathlib.Path, signum: int) -> None:
    make_photo_tree(tmp_path / "photos", num_images=120, size=(500, 375), seed=7)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(tmp_path / "photos"),
            "--output_dir",
            str(out),
            "--image_size",
            "96",
            "--num_shards",
            "4",
        ],
        cwd=REPO,
        start_new_session=True,
        # A suite started in the background inherits SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # a hang guard: the verdict rests on the folder, not the clock
        while not _converting(out) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.poll() is None and _converting(out), "the run never reached its conversion"
        os.killpg(process.pid, signum)  # what a terminal (Ctrl-C), `timeout` and Docker do
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == (143 if signum == signal.SIGTERM else 130), stderr[-3000:]
    noise = [line for line in stderr.splitlines() if any(word in line for word in _NOISE)]
    assert noise == [], stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: ")]
    assert len(said) == 1 and "--resume" in said[0], stderr[-3000:]

"""The local runner's policy: a worker process per core, converting on THREADS_PER_CORE threads a core."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
import time

import psutil
import pytest

from beam_jobs.local_runner import (
    BEAM_WORKER_MODULE,
    IN_PROCESS,
    THREADS_PER_CORE,
    WORKER_MODULE,
    WORKER_PROCESSES,
    LocalParallelism,
    available_cores,
    local_parallelism,
    worker_command,
)
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO

T = THREADS_PER_CORE


@pytest.mark.parametrize(
    "cores, expected",
    [
        (1, (IN_PROCESS, 1, T)),
        (2, (WORKER_PROCESSES, 2, T)),
        (4, (WORKER_PROCESSES, 4, T)),
        (16, (WORKER_PROCESSES, 16, T)),
    ],
)
def test_by_default_each_core_gets_a_worker_process_and_1_core_no_worker(cores, expected):
    assert local_parallelism(cores) == LocalParallelism(*expected)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 7, 16, 33])
def test_every_core_is_served_and_no_process_serves_more_than_its_share(cores):
    parallelism = local_parallelism(cores)
    assert parallelism.workers * parallelism.convert_threads >= THREADS_PER_CORE * cores
    assert parallelism.convert_threads <= THREADS_PER_CORE * max(1, cores // parallelism.workers)


@pytest.mark.parametrize(
    "cores, mode, workers, expected",
    [
        # --direct_num_workers alone: one means this process, more mean worker processes.
        (2, None, 1, (IN_PROCESS, 1, 2 * T)),
        (2, None, 2, (WORKER_PROCESSES, 2, T)),
        (16, None, 1, (IN_PROCESS, 1, 16 * T)),
        # Beam's 0, "all cores": a worker each, as Beam would start.
        (2, None, 0, (WORKER_PROCESSES, 2, T)),
        (2, WORKER_PROCESSES, None, (WORKER_PROCESSES, 2, T)),
        (2, WORKER_PROCESSES, 0, (WORKER_PROCESSES, 2, T)),
        (8, WORKER_PROCESSES, 3, (WORKER_PROCESSES, 3, 3 * T)),  # 3 cores a worker, rounded up
        # The in-process mode has one worker whatever is asked; its threads fill the cores.
        (8, IN_PROCESS, None, (IN_PROCESS, 1, 8 * T)),
        (8, IN_PROCESS, 4, (IN_PROCESS, 1, 8 * T)),
        # Beam's threaded mode: its workers are threads of this process, each with its own.
        (4, "multi_threading", 2, ("multi_threading", 2, 2 * T)),
    ],
)
def test_what_the_user_gives_is_kept_and_the_threads_fill_the_cores(cores, mode, workers, expected):
    assert local_parallelism(cores, mode=mode, workers=workers) == LocalParallelism(*expected)


def test_a_negative_worker_count_is_refused_with_its_value():
    with pytest.raises(ValueError, match=r"--direct_num_workers .*\(got -1\)"):
        local_parallelism(2, workers=-1)


def test_the_cores_are_those_this_process_may_use():
    assert 1 <= available_cores() <= (psutil.cpu_count() or 1)


def test_a_worker_runs_the_same_interpreter_with_the_quick_exit_module():
    beam = f"/opt/my env/bin/python3 -m {BEAM_WORKER_MODULE}"
    assert worker_command(beam, 4321) == f"/opt/my env/bin/python3 -m {WORKER_MODULE} 4321"


def _worker_processes(pid: int) -> list[psutil.Process]:
    """The local workers under process ``pid``: the Python processes that run local_worker.py
    (Beam's harness, with a quick exit), started cold by Beam through /bin/sh -c or forked warm
    by the one process that imported for them (which is no worker itself)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            command = child.cmdline()
            # A process being started or reaped has no command line yet, or none any more.
            if command and "python" in pathlib.Path(command[0]).name and WORKER_MODULE in command:
                found.append((child, child.ppid()))
        except psutil.Error:
            continue
    forking = {parent for _, parent in found}
    return [process for process, _ in found if process.pid not in forking]


@pytest.mark.slow
def test_a_default_run_starts_the_worker_processes_the_policy_names(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=40, seed=3)
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(tmp_path / "out")],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    most, cold = 0, set()
    while process.poll() is None:
        workers = _worker_processes(process.pid)
        most = max(most, len(workers))
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                if "--warm" not in worker.cmdline():
                    cold.add(worker.pid)
        time.sleep(0.05)
    assert process.returncode == 0, process.stderr.read()[-3000:]
    expected = local_parallelism(available_cores())
    assert most == (0 if expected.mode == IN_PROCESS else expected.workers)
    assert not cold, "the command's warm workers were claimed, none started cold"


def _job_with_two_workers(tmp_path: pathlib.Path, *, seed: int) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """A conversion of 400 photos started in two worker processes (lanczos, to keep them busy),
    and those workers once both run."""
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=400, seed=seed)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(photos),
            "--output_dir",
            str(tmp_path / "out"),
            "--direct_running_mode",
            "multi_processing",
            "--direct_num_workers",
            "2",
            "--resample",
            "lanczos",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    workers: list[psutil.Process] = []
    while len(workers) < 2 and process.poll() is None and time.monotonic() < deadline:
        workers = _worker_processes(process.pid)
        time.sleep(0.05)
    assert len(workers) == 2, "the job never started its two workers"
    return process, workers


@pytest.mark.slow
def test_workers_end_with_a_job_killed_outright(tmp_path):
    # SIGKILL (or the OOM killer) leaves the job no chance to clean up: its workers, started
    # through a shell that outlives it too, must notice by themselves, and not hold its output.
    process, workers = _job_with_two_workers(tmp_path, seed=5)
    process.kill()  # the job's process alone, as the OOM killer does: not its process group
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"workers outlived the killed job: {[w.pid for w in alive]}"
    # Nothing holds the job's output any more: reading it to the end returns.
    out, err = process.communicate(timeout=30)
    assert process.returncode == -9


@pytest.mark.slow
def test_a_worker_killed_mid_run_fails_the_run_with_one_line_that_says_so(tmp_path):
    # One worker killed (the OOM killer's usual victim): the runner's threads raise as well, and
    # none of their tracebacks may reach the console; the one line says what happened and that
    # the shards completed so far stay for --resume.
    process, workers = _job_with_two_workers(tmp_path, seed=6)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out").glob("shards/*/.train-*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)  # until a first shard is staged: the workers are converting
    workers[0].kill()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("images-to-tfrecords: error:")]
    assert len(errors) == 1 and "worker process" in errors[0] and "--resume" in errors[0], err[-3000:]
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    assert not (tmp_path / "out" / "dataset_info.json").exists()
    assert not _worker_processes(process.pid)

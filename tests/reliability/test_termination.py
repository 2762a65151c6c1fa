"""Runs that end badly: SIGTERM at several moments, a run with nothing usable, files of the user's.

SIGTERM is what `timeout`, Docker, Kubernetes and Slurm send; the run must end as an interrupted
one does (one error line, no lock, no progress file, no temp files of its own) and `--resume`
must then finish it. The moments are tied to what the run has left in its output folder, never
to the clock, so that a fast or a slow machine sees the same moments.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from beam_jobs.command_line.termination import InterruptedState, interrupted_line
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import IN_PROCESS, REPO, run_cli
from tests.dataset_files import dead_letters_path, tree_files

pytestmark = pytest.mark.slow

ARGS = ["--image_size", "48", "--num_shards", "4"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("photos")
    make_photo_tree(root, num_images=48, seed=5)
    return root


def _names(folder: pathlib.Path) -> list[str]:
    """The folder's top-level names and those in its run folders (shards/<run>/), in one list."""
    try:
        return sorted([*os.listdir(folder), *(p.name for p in folder.glob("shards/*/*"))])
    except FileNotFoundError:
        return []


def _listing(names: list[str]) -> bool:
    """The lock is taken: the run is starting its pipeline or listing the inputs."""
    return ".images-to-tfrecords.lock" in names


def _converting(names: list[str]) -> bool:
    """A shard is complete (its sidecar is written last): others are still being converted."""
    return any(n.startswith(".train-") and n.endswith(".tfrecord.json") for n in names)


def _finalizing(names: list[str]) -> bool:
    """Every shard is complete (or the version already committed): the run is finalizing."""
    return (
        len([n for n in names if n.startswith(".train-") and n.endswith(".tfrecord.json")]) == 4
        or "dataset_info.json" in names
    )


def _wait_for(moment, out: pathlib.Path, process: subprocess.Popen, deadline_s: float = 240) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and process.poll() is None:
        if moment(_names(out)):
            return
        time.sleep(0.01)
    # Finalize can be over between two looks; the test then checks the dataset is whole.
    if not (moment is _finalizing and process.poll() == 0):
        raise AssertionError(f"the run never reached that moment (exit {process.poll()}): {_names(out)}")


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _all_gone(processes: list[psutil.Process], deadline_s: float = 60) -> list[int]:
    """Waits (generously) for the processes to end; returns those still running."""
    _, alive = psutil.wait_procs(processes, timeout=deadline_s)
    return [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    "moment, to_group, signum, mode",
    [
        (_listing, True, signal.SIGTERM, ()),
        (_converting, True, signal.SIGTERM, ()),
        (_converting, False, signal.SIGTERM, ()),  # Docker and Kubernetes signal the job's process only
        (_finalizing, True, signal.SIGTERM, ()),
        (_converting, True, signal.SIGINT, ()),  # Ctrl-C: the terminal signals the whole group
        # The same with the local runner in the job's own process (--direct_running_mode in_memory).
        (_converting, True, signal.SIGTERM, IN_PROCESS),
        (_converting, False, signal.SIGTERM, IN_PROCESS),
        (_converting, True, signal.SIGINT, IN_PROCESS),
    ],
    ids=[
        "listing-group",
        "converting-group",
        "converting-process-only",
        "finalizing-group",
        "ctrl-c",
        "in-process-converting-group",
        "in-process-converting-process-only",
        "in-process-ctrl-c",
    ],
)
def test_sigterm_ends_the_run_like_an_interrupt_and_resume_finishes_it(
    photos, tmp_path, moment, to_group, signum, mode
):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), *ARGS, *mode],
        cwd=REPO,
        start_new_session=True,
        # A suite started in the background inherits SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(moment, out, process)
        workers = _descendants(process.pid)
        os.kill(process.pid, signum)
        if to_group:  # as `timeout` does: the job's process, then its whole process group
            os.killpg(process.pid, signum)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    names = _names(out)
    line = next((line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: ")), "")
    if process.returncode != 0:
        _assert_says_what_is_staged(line, out)
    if process.returncode == 0:
        # Finalize had already committed the dataset when the signal came: a whole dataset, then.
        assert moment is _finalizing, stderr[-3000:]
        assert json.loads((out / "dataset_info.json").read_text())["splits"]["train"]["num_examples"] == 48
    elif signum == signal.SIGINT:
        assert process.returncode == 130, (process.returncode, stderr[-3000:])
        said = [line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: ")]
        assert len(said) == 1 and "interrupted; " in said[0], stderr[-3000:]
    else:
        assert process.returncode == 143, (process.returncode, stderr[-3000:])
        errors = [line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]
        assert len(errors) == 1 and "terminated (SIGTERM)" in errors[0], stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
    assert _all_gone(workers) == [], "worker processes outlived the run"
    assert ".images-to-tfrecords.lock" not in names, names
    assert not [n for n in names if n.startswith((".progress-", ".tmp-"))], names
    if process.returncode != 0:
        resumed = run_cli("--input", photos, "--output_dir", out, *ARGS, "--resume")
        assert resumed.returncode == 0
        assert json.loads((out / "dataset_info.json").read_text())["splits"]["train"]["num_examples"] == 48
        assert [n for n in os.listdir(out) if n.startswith(".")] == [".commit.lock"], _names(out)


def _assert_says_what_is_staged(line: str, out: pathlib.Path) -> None:
    """The interrupt line counts the shards the run left staged (all sidecars in a fresh folder are
    its own), and suggests --resume only when there is something to resume."""
    staged = len([n for n in _names(out) if n.startswith(".train-") and n.endswith(".tfrecord.json")])
    if staged:
        plural = "s" if staged != 1 else ""
        assert f"the {staged} shard{plural} converted so far {'is' if staged == 1 else 'are'} staged" in line, line
        assert "--resume" in line, line
    else:
        assert "nothing was converted yet" in line and "--resume" not in line, line


@pytest.mark.parametrize(
    "staged, completed, says",
    [
        (0, False, "interrupted; nothing was converted yet: rerun the same command"),
        (1, False, "interrupted; the 1 shard converted so far is staged: rerun with --resume"),
        (3, False, "interrupted; the 3 shards converted so far are staged: rerun with --resume"),
        (0, True, "interrupted; the dataset was already complete"),
    ],
)
def test_the_interrupt_line_says_what_the_run_left(staged, completed, says):
    line = interrupted_line(overwrite=False, terminated=False, state=InterruptedState(staged, completed))
    assert says in line, line


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]


def _unusable_tree(root: pathlib.Path) -> pathlib.Path:
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for index in range(2):
            (root / label / f"{index}.jpg").write_bytes(b"<html>not found</html>")
    return root


def test_a_run_in_which_no_input_is_usable_fails_even_when_every_input_may_be_bad(tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "--input",
        _unusable_tree(tmp_path / "broken"),
        "--output_dir",
        out,
        *ARGS,
        "--max_bad_fraction",
        "1",
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    [error] = _error_lines(result)
    assert "no input became an example (4 of 4 inputs could not be used" in error and "not_an_image 4" in error
    assert "converted so far" not in error, error  # no shard file was written: none to speak of
    assert "Traceback" not in result.stderr
    assert not (out / "dataset_info.json").exists()
    assert [d["reason"] for d in map(json.loads, dead_letters_path(out).read_text().splitlines())] == [
        "not_an_image"
    ] * 4
    assert not [n for n in _names(out) if n.startswith((".tmp-", ".progress-", ".images-to-tfrecords"))]


def test_an_overwrite_run_with_no_usable_input_keeps_the_old_dataset(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *ARGS)
    before = tree_files(out)
    result = run_cli(
        "--input",
        _unusable_tree(tmp_path / "broken"),
        "--output_dir",
        out,
        *ARGS,
        "--overwrite",
        "--max_bad_fraction",
        "1",
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no input became an example" in _error_lines(result)[0]
    assert "version 1 of the dataset stays current, unchanged" in _error_lines(result)[0]
    after = tree_files(out)
    assert {name: after.get(name) for name in before} == before
    # What the refused run added is its own folder's (its dead letters), which no version lists.
    assert all(
        name.startswith("shards/") and name.split("/")[1] != json.loads(before["dataset_info.json"])["change"]["run"]
        for name in set(after) - set(before)
    )


USERS_FILES = {
    "plan.json": b'{"my": "project plan"}\n',
    "notes.txt": b"mine\n",
    "train-foo.tfrecord": b"the user's own records",
}


def test_the_users_files_survive_a_run_an_overwrite_run_and_a_plan_only_run(photos, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name, data in USERS_FILES.items():
        (out / name).write_bytes(data)
    run_cli("--input", photos, "--output_dir", out, *ARGS)
    run_cli("--input", photos, "--output_dir", out, *ARGS, "--overwrite")
    assert {name: (out / name).read_bytes() for name in USERS_FILES} == USERS_FILES
    # --plan_only refuses to replace a plan.json it did not write, naming it, and changes nothing.
    before = tree_files(out)
    result = run_cli("--input", photos, "--output_dir", out, *ARGS, "--plan_only", check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [error] = _error_lines(result)
    assert "plan.json that this job did not write" in error and str(out / "plan.json") in error
    assert tree_files(out) == before


def test_the_jobs_own_plan_is_replaced_by_the_next_plan_and_removed_by_the_next_run(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *ARGS, "--plan_only")
    run_cli("--input", photos, "--output_dir", out, *ARGS, "--plan_only")
    assert json.loads((out / "plan.json").read_text())["producer"]["name"] == "images-to-tfrecords"
    run_cli("--input", photos, "--output_dir", out, *ARGS)
    assert "plan.json" not in _names(out) and "plan_dead_letters.jsonl" not in _names(out)


def _wait_until_sleeping(pid: int, *, timeout_s: float = 60.0) -> None:
    """Until the main thread of ``pid`` is in state S (interruptible sleep), read from /proc."""
    deadline = time.monotonic() + timeout_s
    stat_file = pathlib.Path(f"/proc/{pid}/task/{pid}/stat")
    while time.monotonic() < deadline:
        # The state follows the command name, which is in parentheses and may hold spaces.
        if stat_file.read_text().rsplit(")", 1)[1].split()[0] == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"the main thread of {pid} never blocked")


def test_a_sigterm_the_blocked_main_thread_never_sees_still_cleans_up_and_exits_143(tmp_path):
    # The main thread waits for ever on a lock with SIGTERM blocked, as a runner's does on a
    # worker the signal killed: the Python-level handler never runs; the watchdog must act.
    marker = tmp_path / "cleaned"
    script = f"""
import pathlib, signal, threading
from beam_jobs.command_line.termination import on_stuck, sigterm_as_interrupt
with sigterm_as_interrupt(stuck_after_s=1):
    on_stuck(lambda signum: pathlib.Path({str(marker)!r}).write_text(str(signum)))
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
    print("ready", flush=True)
    never = threading.Lock()
    never.acquire()
    never.acquire()
"""
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        # Signalled only once the main thread sleeps in the lock: a signal that lands while it
        # still runs bytecode reaches the Python-level handler, and this is not that case. After
        # "ready" nothing else in the script can sleep (its one other thread waits in a read,
        # without the GIL), so a sleeping main thread is the blocked acquire.
        _wait_until_sleeping(process.pid)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) == 143
    finally:
        if process.poll() is None:
            process.kill()
    assert marker.read_text() == str(int(signal.SIGTERM))


def _catches_sigterm(pid: int) -> bool:
    """Whether ``pid`` has a handler for SIGTERM: bit 15 of the SigCgt mask in /proc."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _imports_numpy(pid: int) -> bool:
    """Whether ``pid`` has loaded NumPy's core extension: the job's heavy imports have begun."""
    return "_multiarray_umath" in pathlib.Path(f"/proc/{pid}/maps").read_text()


def _job(out: pathlib.Path, photos: pathlib.Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), *ARGS, *extra],
        cwd=REPO,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each stdout line leaves as it is printed
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _terminated_line(process: subprocess.Popen, stdout: str, stderr: str) -> str:
    """The run's one error line, once it is checked that SIGTERM ended it as the docs promise."""
    assert process.returncode == 143, (process.returncode, stdout[-2000:], stderr[-3000:])
    errors = [line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: ")]
    assert len(errors) == 1 and errors[0].startswith("images-to-tfrecords: error: terminated (SIGTERM); "), stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


def test_sigterm_as_the_job_starts_its_heavy_imports_ends_it_with_the_line(photos, tmp_path):
    # The earliest moment the entry point can answer for: the first of its heavy imports (NumPy,
    # Pillow, then Beam), or its handler in place, whichever /proc shows first. Before that is the
    # interpreter's own start, where SIGTERM ends any Python program (docs/reliability.md says so).
    out = tmp_path / "out"
    process = _job(out, photos)
    try:
        deadline = time.monotonic() + 120
        while not (_catches_sigterm(process.pid) or _imports_numpy(process.pid)):
            assert time.monotonic() < deadline and process.poll() is None, "the job never started"
            time.sleep(0.001)
        os.kill(process.pid, signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    line = _terminated_line(process, stdout, stderr)
    assert "nothing was converted yet" in line, line
    assert not out.exists() or not [n for n in _names(out) if n != ".commit.lock"], _names(out)


def _writing_to_stdout(pid: int) -> bool:
    """Whether the main thread of ``pid`` is blocked in write(2) to its stdout (/proc's syscall
    file: the syscall's number, then its arguments)."""
    fields = pathlib.Path(f"/proc/{pid}/syscall").read_text().split()
    return fields[:2] == [str(_WRITE_SYSCALL), "0x1"]


_WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}.get(os.uname().machine, 1)
_F_SETPIPE_SZ = 1031


def _full_pipe() -> tuple[int, int]:
    """A pipe of one page, filled: the first write to it blocks until its reader reads."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, _F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"." * 4096)
    os.set_blocking(write_end, True)  # The job's stdout shares this flag: it must block, as any stdout may.
    return read_end, write_end


@pytest.mark.parametrize("to_group", [False, True], ids=["process", "group"])
def test_sigterm_after_the_commit_ends_the_run_with_the_line_and_a_whole_version(photos, tmp_path, to_group):
    # The job prints nothing on stdout until its run has committed; its stdout is a full pipe, so
    # it then blocks in its first print, after the commit and before its summary: a moment of the
    # process's own, held for as long as the test needs. SIGTERM there (and in the rest of the
    # exit, whose teardown of Beam's modules takes a tenth of a second or more) used to end it by
    # the raw signal, without a word.
    out = tmp_path / "out"
    read_end, write_end = _full_pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), *ARGS],
        cwd=REPO,
        start_new_session=True,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    try:
        deadline = time.monotonic() + 300
        while not _writing_to_stdout(process.pid):
            assert time.monotonic() < deadline and process.poll() is None, "the job never printed its summary"
            time.sleep(0.01)
        assert (out / "dataset_info.json").exists() and not (out / ".images-to-tfrecords.lock").exists()
        os.kill(process.pid, signal.SIGTERM)
        if to_group:
            os.killpg(process.pid, signal.SIGTERM)
        with os.fdopen(read_end, "rb") as reader:  # A reader again: whatever the job still prints may leave.
            stdout = reader.read().decode("utf-8", "replace")
        stderr = process.stderr.read()
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    line = _terminated_line(process, stdout, stderr)
    assert "the dataset was already complete" in line and "--resume" not in line, line
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["version"] == 1 and info["splits"]["train"]["num_examples"] == 48
    verified = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(out)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert not [n for n in _names(out) if n.startswith((".progress-", ".tmp-", ".images-to-tfrecords"))], _names(out)

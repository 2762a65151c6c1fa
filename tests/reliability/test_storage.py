"""Storage faults: read-only, full and forbidden outputs; kills and reruns; retried bundles."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from beam_jobs.config import ImageConfig
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from beam_jobs.writing.convert_shards import ConvertShardFn
from tests.conftest import REPO, run_cli
from tests.dataset_files import current_files, flat_names

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def tmpfs(path, *options: str):
    """A real, small or read-only filesystem (the tests run as root, as CI does)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def immutable(path):
    """A folder nobody may write to, not even root (chattr +i): 'Operation not permitted'."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def _final_names(folder) -> list[str]:
    """What a reader could take for a dataset in the folder: its visible top-level files (the run
    folders under shards/ hold nothing a reader uses until a manifest lists them)."""
    return sorted(n for n in os.listdir(folder) if not n.startswith(".") and n != "shards") if folder.exists() else []


def _run_files(folder) -> list[str]:
    """The names of the files in every run folder under shards/."""
    return [p.name for p in folder.glob("shards/*/*")] if folder.exists() else []


def _assert_shards_complete(folder) -> None:
    """Every file under a final shard name, in any run folder, reads to its end with valid CRCs."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    for path in folder.glob("shards/*/*.tfrecord"):
        if not path.name.startswith("."):  # pathlib's "*" matches hidden temp files too
            sum(1 for _ in tf.data.TFRecordDataset(str(path)))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_photo_tree(root, num_images=120, seed=21)
    return root


@pytest.fixture(scope="module")
def reference(photos, tmp_path_factory):
    """An uninterrupted run, to compare everything else with."""
    out = tmp_path_factory.mktemp("reference")
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "6")
    return out


def test_read_only_output_fails_clearly_before_any_work(photos, tmp_path):
    with tmpfs(tmp_path / "ro", "ro", "size=1m") as folder:
        result = run_cli("--input", photos, "--output_dir", folder / "out", check=False)
        assert result.returncode == 2
        assert "cannot write to --output_dir" in result.stderr and "Read-only file system" in result.stderr
        assert _final_names(folder) == []


def test_forbidden_output_fails_clearly(photos, tmp_path):
    with immutable(tmp_path / "locked") as folder:
        result = run_cli("--input", photos, "--output_dir", folder, check=False)
        assert result.returncode == 2
        assert "cannot write to --output_dir" in result.stderr and "not permitted" in result.stderr
        assert _final_names(folder) == []


def test_full_disk_fails_clearly_and_leaves_no_final_name(photos, tmp_path):
    with tmpfs(tmp_path / "small", "size=256k") as folder:
        result = run_cli(
            "--input", photos, "--output_dir", folder, "--image_size", "128", "--num_shards", "3", check=False
        )
        assert result.returncode == 1, result.stderr[-2000:]
        assert "No space left on device" in result.stderr
        assert "nothing was committed" in result.stderr
        assert _final_names(folder) == []
        _assert_shards_complete(folder)
        assert not list(folder.rglob(".tmp-*"))  # the failed run's writers are ended, their temp files gone


def _wait_until(predicate, folder, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if predicate(_run_files(folder)):
            return
        time.sleep(0.001)  # a shard's temp file lives for a few tens of milliseconds


def test_random_kills_then_resume_give_byte_identical_output(photos, reference, tmp_path):
    out = tmp_path / "out"
    args = [
        sys.executable,
        "-m",
        "beam_jobs",
        "--input",
        str(photos),
        "--output_dir",
        str(out),
        "--image_size",
        "64",
        "--num_shards",
        "6",
    ]
    rng = random.Random(4)
    # Moments tied to progress, not to the clock, so that a fast machine cannot finish first:
    # mid-conversion (a shard complete), mid-shard (a temp file open), and during start-up.
    moments = [
        lambda names: any(n.endswith(".tfrecord") and not n.startswith(".") for n in names),
        lambda names: any(n.startswith(".tmp-") for n in names),
        None,
    ]
    for attempt, moment in enumerate(moments):
        process = subprocess.Popen(
            args + (["--resume"] if attempt else []),
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if moment is None:
            time.sleep(rng.uniform(0.3, 1.5))  # a resumed run of these few photos ends in 3 s or so
        else:
            _wait_until(moment, out, process)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pytest.fail(f"attempt {attempt}: the run ended (exit {process.poll()}) before the moment to kill it came")
        process.wait()
        if attempt == 0:
            assert "dataset_info.json" not in os.listdir(out)
            assert _final_names(out) == []
            _assert_shards_complete(out)
    run_cli(*args[3:], "--resume")
    assert flat_names(out) == flat_names(reference)
    assert [n for n in os.listdir(out) if n.startswith(".")] == [".commit.lock"]
    assert current_files(out) == current_files(reference)


def test_a_different_dataset_is_refused_without_overwrite(photos, reference, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "6")
    for extra in ([], ["--resume"]):
        result = run_cli(
            "--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "4", *extra, check=False
        )
        assert result.returncode == 2 and "--overwrite" in result.stderr
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "4", "--overwrite")
    names = [name for name in flat_names(out) if not name.startswith("shards/")]  # version 1 stays, as kept
    assert names == ["dataset_info.json", "dead_letters.jsonl"] + [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert json.loads((out / "dataset_info.json").read_text())["splits"]["train"]["num_shards"] == 4


def test_stale_shards_of_an_interrupted_run_never_mix_with_a_resumed_one(photos, reference, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(photos),
            "--output_dir",
            str(out),
            "--image_size",
            "64",
            "--num_shards",
            "4",
        ],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        n.endswith(".tfrecord") and not n.startswith(".") for n in _run_files(out)
    ):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "6", "--resume")
    # The killed run's folder (4 shards, other settings) is collected once the resumed run commits.
    assert flat_names(out) == flat_names(reference)
    assert current_files(out) == current_files(reference)


def test_the_same_shard_converted_twice_at_once_gives_one_complete_file(photos, tmp_path):
    inputs = [
        InputFile(str(p.relative_to(photos)), str(p), label=p.parent.name) for p in sorted(photos.rglob("*.jpg"))[:30]
    ]
    [shard] = plan_dataset(inputs, num_shards=1, example_bytes=1).shards
    outputs = []

    def convert(folder):
        fn = ConvertShardFn(ImageConfig(width=48, height=48), str(folder))
        fn.setup()
        try:
            outputs.append(list(fn.process(shard)))
        finally:
            fn.teardown()

    (tmp_path / "both").mkdir()
    (tmp_path / "alone").mkdir()
    threads = [threading.Thread(target=convert, args=(tmp_path / "both",)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    convert(tmp_path / "alone")
    assert (
        sorted(os.listdir(tmp_path / "both"))
        == sorted(os.listdir(tmp_path / "alone"))
        == [".train-00000-of-00001.tfrecord.json", "train-00000-of-00001.tfrecord"]
    )
    name = "train-00000-of-00001.tfrecord"
    assert (tmp_path / "both" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()
    assert outputs[0][-1] == outputs[1][-1] == outputs[2][-1]  # The same ShardResult each time.

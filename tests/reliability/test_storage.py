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
from beam_jobs.convert import ConvertShardFn
from beam_jobs.plan import plan_dataset
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def tmpfs(path, *options: str):
    """A real, small or read-only filesystem (the tests run as root, as CI does)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                             capture_output=True, text=True)
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
    return sorted(n for n in os.listdir(folder) if not n.startswith(".")) if folder.exists() else []


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
        result = run_cli("--input", photos, "--output_dir", folder, "--image_size", "128", "--num_shards", "3",
                         check=False)
        assert result.returncode == 1, result.stderr[-2000:]
        assert "No space left on device" in result.stderr
        assert "no shard was left under a final name" in result.stderr
        assert _final_names(folder) == []


def _wait_until(predicate, folder, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if predicate(os.listdir(folder) if folder.exists() else []):
            return
        time.sleep(0.02)


def test_random_kills_then_resume_give_byte_identical_output(photos, reference, tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out),
            "--image_size", "64", "--num_shards", "6"]
    rng = random.Random(4)
    # Moments tied to progress, not to the clock, so that a fast machine cannot finish first:
    # mid-conversion (a shard staged), mid-shard (a temp file open), and during start-up.
    moments = [
        lambda names: any(n.startswith(".staged-") for n in names),
        lambda names: any(n.startswith(".tmp-") for n in names),
        None,
    ]
    for attempt, moment in enumerate(moments):
        process = subprocess.Popen(args + (["--resume"] if attempt else []), cwd=REPO, start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if moment is None:
            time.sleep(rng.uniform(0.5, 2.5))
        else:
            _wait_until(moment, out, process)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if attempt == 0:
            assert "dataset_info.json" not in os.listdir(out)
            assert _final_names(out) == []
    run_cli(*args[3:], "--resume")
    assert _final_names(out) == _final_names(reference)
    assert [n for n in os.listdir(out) if n.startswith(".")] == []
    for name in _final_names(reference):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_different_dataset_is_refused_without_overwrite(photos, reference, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "6")
    for extra in ([], ["--resume"]):
        result = run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "4",
                         *extra, check=False)
        assert result.returncode == 2 and "--overwrite" in result.stderr
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "4", "--overwrite")
    names = _final_names(out)
    assert names == ["dataset_info.json", "dead_letters.jsonl"] + [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert json.loads((out / "dataset_info.json").read_text())["splits"]["train"]["num_shards"] == 4


def test_stale_shards_of_an_interrupted_run_never_mix_with_a_resumed_one(photos, reference, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out),
         "--image_size", "64", "--num_shards", "4"], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            n.startswith(".staged-") for n in (os.listdir(out) if out.exists() else [])):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    run_cli("--input", photos, "--output_dir", out, "--image_size", "64", "--num_shards", "6", "--resume")
    assert os.listdir(out) and sorted(os.listdir(out)) == _final_names(reference)
    for name in _final_names(reference):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_the_same_shard_converted_twice_at_once_gives_one_complete_file(photos, tmp_path):
    inputs = [InputFile(str(p.relative_to(photos)), str(p), label=p.parent.name) for p in sorted(photos.rglob("*.jpg"))[:30]]
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
    assert sorted(os.listdir(tmp_path / "both")) == sorted(os.listdir(tmp_path / "alone")) == [
        ".staged-train-00000-of-00001.tfrecord", ".staged-train-00000-of-00001.tfrecord.json"]
    name = ".staged-train-00000-of-00001.tfrecord"
    assert (tmp_path / "both" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()
    assert outputs[0][-1] == outputs[1][-1] == outputs[2][-1]  # The same ShardResult each time.

"""The reader on s3://, against a real MinIO server: the shards come through the verified local
cache, and what training sees is what reading a local copy gives, example for example."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

import beam_jobs
import tfdata_readers as tfr
from beam_jobs.sample_data import make_photo_tree
from tests.objectstores.conftest import local_files
from tfdata_readers.sources import storage
from tfdata_readers.sources.shard_cache import ShardCache

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("s3reader")
    make_photo_tree(root / "photos", num_images=36, size=(64, 48), seed=3)
    beam_jobs.convert(str(root / "photos"), output_dir=str(root / "out"), image_size=32, num_shards=4)
    return root / "out"


@pytest.fixture
def s3_dataset(minio, local_dataset, monkeypatch) -> str:
    """The local dataset uploaded to a fresh bucket; the AWS default chain pointed at MinIO."""
    bucket = f"reader-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for path in local_files(local_dataset):
        client.upload_file(str(path), bucket, f"data/{path.relative_to(local_dataset).as_posix()}")
    for name, value in {
        "AWS_ENDPOINT_URL": minio.endpoint,
        "AWS_ACCESS_KEY_ID": minio.access_key,
        "AWS_SECRET_ACCESS_KEY": minio.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    storage._client_for.cache_clear()  # pylint: disable=protected-access  # a client for these settings
    yield f"s3://{bucket}/data"
    storage._client_for.cache_clear()  # pylint: disable=protected-access


def _examples(data_dir: str | pathlib.Path, config: tfr.ReadConfig, **options) -> list[tuple[bytes, bytes]]:
    dataset = tfr.make_dataset(data_dir, "train", 4, config=config, with_metadata=True, dtype="uint8", **options)
    return [
        (key, image.tobytes())
        for images, _, meta in dataset
        for key, image in zip(meta["key"].numpy(), images.numpy(), strict=True)
    ]


def test_s3_reads_the_examples_bytes_and_order_of_a_local_copy(s3_dataset, local_dataset, tmp_path):
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "cache"))
    for options in ({}, {"training": True, "seed": 5}):
        local = _examples(local_dataset, tfr.ReadConfig(), **options)
        assert _examples(s3_dataset, config, **options) == local and len(local) > 20
    assert tfr.steps_per_epoch(s3_dataset, "train", 4) == tfr.steps_per_epoch(local_dataset, "train", 4)
    assert tfr.class_counts(s3_dataset, "train") == tfr.class_counts(local_dataset, "train")


def test_s3_through_a_cache_smaller_than_the_dataset_stays_under_its_limit(s3_dataset, local_dataset, tmp_path):
    shards = json.loads((local_dataset / "dataset_info.json").read_text())["splits"]["train"]["shards"]
    limit = 2 * max(s["bytes"] for s in shards) + 1
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit, cycle_length=2)
    want = _examples(local_dataset, tfr.ReadConfig(cycle_length=2), training=True, seed=1)
    assert _examples(s3_dataset, config, training=True, seed=1) == want
    assert len({key for key, _ in want}) == len(want)
    assert sum(p.stat().st_size for p in (tmp_path / "c").iterdir() if p.suffix == ".tfrecord") <= limit


def test_a_shard_damaged_in_the_bucket_is_named_and_not_read(s3_dataset, minio, local_dataset, tmp_path):
    shard = json.loads((local_dataset / "dataset_info.json").read_text())["splits"]["train"]["shards"][0]
    bucket, key = storage.split_s3(f"{s3_dataset}/{shard['file']}")
    data = bytearray((local_dataset / shard["file"]).read_bytes())
    data[-5] ^= 0xFF
    minio.client().put_object(Bucket=bucket, Key=key, Body=bytes(data))
    with pytest.raises(Exception, match=rf"shard s3://{bucket}/{key}: its bytes have sha256"):
        _examples(s3_dataset, tfr.ReadConfig(cache_dir=str(tmp_path / "cache")))


_DOWNLOAD_ONE = """
import sys
from tfdata_readers.sources.shard_cache import ShardCache
ShardCache(sys.argv[1], 10**9).acquire(sys.argv[2], sys.argv[3], int(sys.argv[4]))
"""


def test_a_download_killed_part_way_is_recovered_by_the_next_reader(s3_dataset, minio, tmp_path):
    """A shard large enough to be caught mid-download: the process fetching it is SIGKILLed while its
    part file grows; the next reader removes the part file and publishes a verified copy."""
    blob = os.urandom(96 * 2**20)
    bucket, prefix = storage.split_s3(s3_dataset)
    uri = f"s3://{bucket}/{prefix}/big.tfrecord"
    minio.client().put_object(Bucket=bucket, Key=f"{prefix}/big.tfrecord", Body=blob)
    digest = hashlib.sha256(blob).hexdigest()
    cache = tmp_path / "cache"
    fetch = subprocess.Popen([sys.executable, "-c", _DOWNLOAD_ONE, str(cache), uri, digest, str(len(blob))])
    deadline = time.monotonic() + 120
    parts: list[pathlib.Path] = []
    while time.monotonic() < deadline and not any(p.stat().st_size > 0 for p in parts if p.exists()):
        assert fetch.poll() is None, "the download ended before it could be killed"
        parts = list(cache.glob(".*.part")) if cache.exists() else []
        time.sleep(0.01)
    fetch.send_signal(signal.SIGKILL)
    fetch.wait(timeout=60)
    assert parts and not (cache / f"{digest}.tfrecord").exists()
    shard_cache = ShardCache(str(cache), 10**9)
    path = shard_cache.acquire(uri, digest, len(blob))
    assert pathlib.Path(path).read_bytes() == blob
    assert not list(cache.glob(".*.part"))
    shard_cache.close()


_READ_AND_EXIT = """
import sys, tfdata_readers as tfr
config = tfr.ReadConfig(cache_dir=sys.argv[2], cycle_length=2, num_epochs=None)
iterator = iter(tfr.make_dataset(sys.argv[1], "train", 4, config=config, training=True, seed=int(sys.argv[3])))
for _ in range(3):
    next(iterator)
print("read", flush=True)
"""


# Each run is a fresh TensorFlow process (10 to 20 s of a loaded 2-core machine): CI runs 20 in a
# row; IMAGES_TO_TFRECORDS_EXIT_RUNS=N runs N (a rare hang needs many to show).
EXIT_RUNS = int(os.environ.get("IMAGES_TO_TFRECORDS_EXIT_RUNS", "20"))


@pytest.mark.timeout(180 * EXIT_RUNS)
def test_processes_that_read_s3_and_drop_the_iterator_exit(s3_dataset, tmp_path):
    """Processes in a row each read a few batches of an s3:// training stream through one cache,
    drop the iterator mid-pass and end: every one exits (a hang is a failure, by the timeout)."""
    script = tmp_path / "read_and_exit.py"
    script.write_text(_READ_AND_EXIT)
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    for run in range(EXIT_RUNS):
        if run % 3 == 0:
            for copy in (tmp_path / "cache").glob("*.tfrecord"):
                copy.unlink()  # some runs download, others read copies already there
        proc = subprocess.run(
            [sys.executable, str(script), s3_dataset, str(tmp_path / "cache"), str(run)],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
        assert proc.returncode == 0 and proc.stdout.split() == ["read"], f"run {run}: {proc.stderr[-3000:]}"


def test_distribute_on_s3_under_mirrored_strategy_reads_each_example_once_and_resumes(
    s3_dataset, local_dataset, tmp_path
):
    """Two replicas over s3:// through the cache: the epoch a local copy gives, then the same epoch
    stopped after 2 global steps and resumed on 3 replicas (initial_step) in a new process."""
    check = pathlib.Path(__file__).resolve().parents[1] / "readers" / "resume_check.py"

    def run(name: str, steps: int, replicas: int, initial_step: int) -> list[list[str]]:
        out = tmp_path / f"{name}.json"
        proc = subprocess.run(
            [sys.executable, str(check), "step", str(out), s3_dataset, "6", str(steps), "--replicas", str(replicas),
             "--initial_step", str(initial_step), "--training", "--cache", str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text())

    steps = tfr.steps_per_epoch(s3_dataset, "train", 6)
    config = tfr.ReadConfig(dtype="uint8", num_epochs=None)
    local = tfr.make_dataset(
        local_dataset, "train", 6, config=config, with_metadata=True, training=True, seed=11, initial_epoch=1
    )
    want = [
        [key.decode(), hashlib.sha1(image.tobytes()).hexdigest()]
        for images, _, meta in local.take(steps)
        for key, image in zip(meta["key"].numpy(), images.numpy(), strict=True)
    ]
    whole = run("whole", steps, 2, 0)
    assert whole == want and len({key for key, _ in whole}) == len(whole)
    assert run("stopped", 2, 2, 0) + run("resumed", steps - 2, 3, 2) == want


def test_an_iterator_checkpoint_over_s3_resumes_in_a_new_process_with_the_cache_emptied(
    s3_dataset, local_dataset, tmp_path
):
    """Saved after 3 batches of a seeded s3:// training stream, restored in a new process after the
    cache folder was deleted: the two halves are the uninterrupted local run, into the next epoch."""
    check = pathlib.Path(__file__).resolve().parents[1] / "readers" / "resume_check.py"

    def run(mode: str, steps: int) -> list[list[str]]:
        out = tmp_path / f"{mode}.json"
        proc = subprocess.run(
            [sys.executable, str(check), mode, str(out), s3_dataset, str(tmp_path / "ckpt"), str(steps),
             "--training", "--cache", str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text())

    total = 2 * tfr.steps_per_epoch(s3_dataset, "train", 5)
    config = tfr.ReadConfig(dtype="uint8", num_epochs=None)
    local = tfr.make_dataset(local_dataset, "train", 5, config=config, with_metadata=True, training=True, seed=11)
    want = [
        [key.decode(), hashlib.sha1(image.tobytes()).hexdigest()]
        for images, _, meta in local.take(total)
        for key, image in zip(meta["key"].numpy(), images.numpy(), strict=True)
    ]
    stopped = run("save", 3)
    shutil.rmtree(tmp_path / "cache")
    assert stopped + run("restore", total - 3) == want and len(stopped) == 15


def test_verify_and_inspect_read_s3_as_they_read_a_local_copy(s3_dataset, minio, local_dataset):
    from tfdata_readers.inspection.gather import gather  # pylint: disable=import-outside-toplevel

    assert tfr.verify(s3_dataset) == [] == tfr.verify(local_dataset)
    remote, local = (
        gather(s3_dataset, num_examples=8, augmented=True),
        gather(local_dataset, num_examples=8, augmented=True),
    )
    assert remote.shards == local.shards and all(row.verified for row in remote.shards)
    assert remote.class_counts == local.class_counts and remote.dead_letters == local.dead_letters
    for split, sample in local.samples.items():
        pairs = zip(remote.samples[split].examples, sample.examples, strict=True)
        assert sample.examples and all(
            a.key == b.key and (a.image == b.image).all() and (a.augmented == b.augmented).all() for a, b in pairs
        )
    # A shard damaged in the bucket: named by its s3:// path, the digest and the record that fails.
    shard = json.loads((local_dataset / "dataset_info.json").read_text())["splits"]["train"]["shards"][0]
    bucket, key = storage.split_s3(f"{s3_dataset}/{shard['file']}")
    data = bytearray((local_dataset / shard["file"]).read_bytes())
    data[-5] ^= 0xFF
    minio.client().put_object(Bucket=bucket, Key=key, Body=bytes(data))
    problems = [str(p) for p in tfr.verify(s3_dataset)]
    assert problems[0].startswith(f"s3://{bucket}/{key}: sha256 ") and "manifest says" in problems[0]
    assert any(p.startswith(f"s3://{bucket}/{key}: unreadable from record") for p in problems), problems
    assert not gather(s3_dataset, num_examples=8).shards[0].verified


def test_explicit_endpoint_and_profile_read_s3_without_the_environment(
    s3_dataset, minio, local_dataset, tmp_path, monkeypatch
):
    """ReadConfig's s3_endpoint_url and s3_profile, and s3_store() for the calls without a ReadConfig,
    stand in for AWS_ENDPOINT_URL and the keys in the environment."""
    (tmp_path / "credentials").write_text(
        f"[minio-test]\naws_access_key_id = {minio.access_key}\naws_secret_access_key = {minio.secret_key}\n"
    )
    (tmp_path / "config").write_text("[profile minio-test]\nregion = us-east-1\n")
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    storage._client_for.cache_clear()  # pylint: disable=protected-access
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "cache"), s3_endpoint_url=minio.endpoint, s3_profile="minio-test")
    assert _examples(s3_dataset, config, training=True, seed=2) == _examples(
        local_dataset, tfr.ReadConfig(), training=True, seed=2
    )
    with tfr.s3_store(endpoint_url=minio.endpoint, profile="minio-test"):
        assert tfr.steps_per_epoch(s3_dataset, "train", 4) == tfr.steps_per_epoch(local_dataset, "train", 4)
        assert tfr.verify(s3_dataset) == []
    with pytest.raises(
        OSError, match=rf"cannot read {s3_dataset}/dataset_info.json from the S3 store at .*AWS_PROFILE"
    ):
        tfr.load_manifest(s3_dataset)  # without them: AWS itself, with no keys

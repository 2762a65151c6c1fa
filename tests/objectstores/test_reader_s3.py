"""The reader on s3://, against a real MinIO server: the shards come through the verified local
cache, and what training sees is what reading a local copy gives, example for example."""

from __future__ import annotations

import json
import pathlib
import uuid

import pytest

import beam_jobs
import tfdata_readers as tfr
from beam_jobs.sample_data import make_photo_tree
from tests.objectstores.conftest import local_files
from tfdata_readers.sources import storage

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

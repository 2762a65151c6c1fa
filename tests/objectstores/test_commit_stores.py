"""Versioned commits on real object stores: MinIO (s3://) and fake-gcs-server (gs://).

First the servers' own preconditions, through the same clients commit.py uses (Beam's): a commit
is only as safe as the store's refusal of a stale conditional write, so that refusal is checked
here, not assumed. Then racing committers, committers SIGKILLed around the root write, and a
commit, a rollback and a gc of a dataset on each store.
"""

from __future__ import annotations

import uuid

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import commit

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture
def s3_out(minio) -> str:
    """A fresh bucket on MinIO, Beam's S3 filesystem pointed at it; returns its output folder."""
    bucket = f"commits-{uuid.uuid4().hex[:8]}"
    minio.client().create_bucket(Bucket=bucket)
    FileSystems.set_options(PipelineOptions(minio.job_flags()))
    return f"s3://{bucket}/out"


@pytest.fixture
def gs_out(fake_gcs, monkeypatch) -> str:
    """A fresh bucket on fake-gcs-server, Beam's GCS filesystem pointed at it."""
    for name, value in fake_gcs.env.items():
        monkeypatch.setenv(name, value)
    bucket = fake_gcs.client().create_bucket(f"commits-{uuid.uuid4().hex[:8]}")
    FileSystems.set_options(PipelineOptions(["--project", "test"]))
    return f"gs://{bucket.name}/out"


def _check_store_preconditions(out: str) -> None:
    """put-if-absent and put-if-match, as commit.py's store issues them, refused when stale."""
    store = commit._store(out)  # pylint: disable=protected-access
    path = f"{out}/probe.json"
    assert store.read(path)[0] is None
    assert store.write_if_absent(path, b"first")
    assert not store.write_if_absent(path, b"second"), "put-if-absent over an existing object succeeded"
    data, first = store.read(path)
    assert data == b"first"
    assert store.replace_if(path, b"third", first)
    assert not store.replace_if(path, b"fourth", first), "a write conditional on a replaced version succeeded"
    data, third = store.read(path)
    assert data == b"third" and third != first
    absent = store.read(f"{out}/absent.json")[1]
    assert not store.replace_if(path, b"fifth", absent), "a write conditional on absence replaced an object"
    assert store.read(path) == (b"third", third)


def test_minio_enforces_if_none_match_and_if_match(s3_out):
    _check_store_preconditions(s3_out)


def test_fake_gcs_enforces_if_generation_match(gs_out):
    _check_store_preconditions(gs_out)

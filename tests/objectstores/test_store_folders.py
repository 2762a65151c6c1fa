"""The object-store tree listing: one delimiter listing finds the first-level folders (and the files
beside them, with their metadata), so the job lists each folder in its own unit of work, on a real
MinIO and a real fake-gcs-server."""

from __future__ import annotations

import os
import uuid

import pytest
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.listing.discover import _first_level, _list_unit
from beam_jobs.listing.policy import Ignored, IgnoredEntry
from beam_jobs.listing.store_folders import list_one_level
from beam_jobs.storage import connect_anonymously_to_a_gcs_emulator

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

# Folder names with glob characters and spaces, a nested folder, files at the top, a folder marker.
NAMES = [
    "tree/cat [1]/a.jpg",
    "tree/cat [1]/deep/b.jpg",
    "tree/dog*/c.jpg",
    "tree/top.jpg",
    "tree/notes.txt",
    "tree/empty/",
    "tree2/x.jpg",
    "tree-sibling/y.jpg",
]
BODY = b"\xff\xd8 not really a jpeg"


def _check(root: str) -> None:
    folders, files = list_one_level(root)
    assert folders == [f"{root}/cat [1]/", f"{root}/dog*/", f"{root}/empty/"]
    assert [(f.path, f.size_in_bytes) for f in files] == [
        (f"{root}/notes.txt", len(BODY)),
        (f"{root}/top.jpg", len(BODY)),
    ]
    assert all(f.last_updated_in_seconds > 0 for f in files)
    # Each unit lists its own subtree, literally (no "[1]" or "*" read as a pattern).
    entries = [entry for unit in _first_level(root) for entry in _list_unit(unit)]
    listed = sorted(entry.path for entry in entries if isinstance(entry, FileMetadata))
    assert listed == sorted(
        f"{root}/{name[len('tree/') :]}" for name in NAMES if name.startswith("tree/") and not name.endswith("/")
    )
    # The "empty/" marker with nothing under it is no file: an empty folder, counted as on disk.
    assert [entry for entry in entries if not isinstance(entry, FileMetadata)] == [IgnoredEntry(Ignored.EMPTY_FOLDER)]


def test_s3_root_is_listed_one_folder_per_unit(minio):
    bucket = f"levels-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for name in NAMES:
        client.put_object(Bucket=bucket, Key=name, Body=b"" if name.endswith("/") else BODY)
    FileSystems.set_options(PipelineOptions(minio.job_flags()))
    _check(f"s3://{bucket}/tree")


def test_gcs_root_is_listed_one_folder_per_unit(fake_gcs, monkeypatch):
    for name, value in fake_gcs.env.items():
        monkeypatch.setenv(name, value)
    connect_anonymously_to_a_gcs_emulator()  # this process imported the job before the variable was set
    bucket = fake_gcs.client().create_bucket(f"levels-{uuid.uuid4().hex[:8]}")
    for name in NAMES:
        bucket.blob(name).upload_from_string(b"" if name.endswith("/") else BODY)
    FileSystems.set_options(PipelineOptions(["--project", "test"]))
    assert os.environ["STORAGE_EMULATOR_HOST"] == fake_gcs.endpoint
    _check(f"gs://{bucket.name}/tree")

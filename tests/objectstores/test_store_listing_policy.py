"""The listing policy on a real MinIO: hidden folders and files are skipped (and counted) at every
depth, as on disk, and a backslash in a key is a character of its name, never a separator."""

from __future__ import annotations

import uuid

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.listing.discover import _first_level, _list_unit, _sort_entry
from beam_jobs.listing.policy import IgnoredEntry
from beam_jobs.records import DeadLetter, InputFile

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

NAMES = [
    "tree/cat/a.jpg",
    "tree/cat/.thumbnails/a.jpg",
    "tree/cat/.thumbnails/b.jpg",
    "tree/cat/._a.jpg",
    "tree/.thumbs/c.jpg",
    "tree/.ipynb_checkpoints/x/d.jpg",
    "tree/a\\b/e.jpg",
    "tree/dog/f\\.jpg",
    "tree/.DS_Store",
]


def test_s3_hidden_keys_are_skipped_and_backslashes_kept(minio):
    bucket = f"policy-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for name in NAMES:
        client.put_object(Bucket=bucket, Key=name, Body=b"\xff\xd8 not really a jpeg")
    FileSystems.set_options(PipelineOptions(minio.job_flags()))
    root = f"s3://{bucket}/tree/"
    entries = [e for unit in _first_level(root) for e in _list_unit(unit)]
    hidden = [e for e in entries if isinstance(e, IgnoredEntry)]
    # .thumbs, .ipynb_checkpoints and .DS_Store at the top; .thumbnails (once) and ._a.jpg below.
    assert sorted(e.kind for e in hidden) == ["hidden"] * 5
    listed = [
        out
        for e in entries
        if not isinstance(e, IgnoredEntry)
        for out in _sort_entry(e, root=root, allow_outside_root=False)
    ]
    assert not [e for e in listed if isinstance(e, DeadLetter)]
    assert sorted(e.filename for e in listed if isinstance(e, InputFile)) == ["a\\b/e.jpg", "cat/a.jpg", "dog/f\\.jpg"]


def test_s3_empty_folder_markers_are_counted_as_empty_folders(minio):
    """A console's "Create folder" makes a marker key "empty/": an empty class folder, counted as on
    disk; a marker with keys under it ("cat/") is no entry at all, and a hidden one stays hidden."""
    bucket = f"empty-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for name in ["tree/cat/", "tree/cat/a.jpg", "tree/empty/", "tree/dog/sub/", "tree/dog/b.jpg", "tree/dog/.thumbs/"]:
        client.put_object(Bucket=bucket, Key=name, Body=b"" if name.endswith("/") else b"x")
    FileSystems.set_options(PipelineOptions(minio.job_flags()))
    root = f"s3://{bucket}/tree/"
    entries = [e for unit in _first_level(root) for e in _list_unit(unit)]
    assert sorted(e.kind for e in entries if isinstance(e, IgnoredEntry)) == ["empty_folder", "empty_folder", "hidden"]
    assert sorted(e.path for e in entries if not isinstance(e, IgnoredEntry)) == [
        f"{root}cat/a.jpg",
        f"{root}dog/b.jpg",
    ]

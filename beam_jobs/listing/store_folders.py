"""One level of an object-store "folder": its sub-folders and its own files, in one paged listing.

Beam's ``FileSystems.match`` has no delimiter: matching ``gs://b/tree/*`` lists every object under
``tree/`` and filters the names afterwards. To list a tree of millions of objects in parallel,
one match per label folder, the job first needs the folder names, and only the stores' delimiter
listing gives those without reading the whole tree. So this module asks the store directly, with
the very clients Beam's GCS and S3 filesystems built from the pipeline options (same endpoint,
same credentials, same emulator settings).

Reaching those clients goes through two private members of Beam's filesystems
(``GCSFileSystem._gcsIO()`` and ``S3FileSystem._options``). They have kept their names across the
Beam 2.5x-2.7x releases; tests/objectstore tests this module against real servers, so a rename
fails there, not on a user's cluster. Other schemes return None: the caller lists the whole root.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems

if TYPE_CHECKING:
    from apache_beam.io.aws.s3filesystem import S3FileSystem
    from apache_beam.io.gcp.gcsfilesystem import GCSFileSystem

__all__ = ["list_one_level"]


def _split(root: str) -> tuple[str, str, str]:
    scheme, rest = root.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return scheme, bucket, prefix


def _gcs_level(filesystem: GCSFileSystem, bucket: str, prefix: str) -> tuple[list[str], list[FileMetadata]]:
    client = filesystem._gcsIO().client  # google.cloud.storage.Client, see the module docstring
    blobs = client.list_blobs(bucket, prefix=prefix, delimiter="/")
    files = [
        FileMetadata(f"gs://{bucket}/{blob.name}", blob.size or 0, blob.updated.timestamp() if blob.updated else 0.0)
        for blob in blobs
        if not blob.name.endswith("/")
    ]
    # ``prefixes`` fills as the pages are read, so it is taken after the loop above.
    folders = [f"gs://{bucket}/{name}" for name in blobs.prefixes]
    return folders, files


def _s3_level(filesystem: S3FileSystem, bucket: str, prefix: str) -> tuple[list[str], list[FileMetadata]]:
    from apache_beam.io.aws import s3io  # the [aws] extra; only reached for s3:// roots

    boto = s3io.S3IO(options=filesystem._options).client.client  # a boto3 S3 client
    folders, files = [], []
    for page in boto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        folders += [f"s3://{bucket}/{entry['Prefix']}" for entry in page.get("CommonPrefixes", [])]
        files += [
            FileMetadata(f"s3://{bucket}/{entry['Key']}", entry["Size"], entry["LastModified"].timestamp())
            for entry in page.get("Contents", [])
            if not entry["Key"].endswith("/")
        ]
    return folders, files


# Each takes the filesystem Beam registers for its scheme (GCSFileSystem, S3FileSystem), which no
# one type of a dict's values can tell apart: Any.
_LISTERS: dict[str, Callable[[Any, str, str], tuple[list[str], list[FileMetadata]]]] = {
    "gs": _gcs_level,
    "s3": _s3_level,
}


def list_one_level(root: str) -> tuple[list[str], list[FileMetadata]] | None:
    """(sub-folders, files) directly under an object-store ``root``, both sorted; None for a
    scheme without a delimiter listing here (the caller then lists the root recursively)."""
    scheme, bucket, prefix = _split(root)
    lister = _LISTERS.get(scheme)
    if lister is None:
        return None
    folders, files = lister(FileSystems.get_filesystem(root), bucket, prefix)
    return sorted(set(folders)), sorted(files, key=lambda meta: meta.path)

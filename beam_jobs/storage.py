"""Atomic small-file writes on any Beam filesystem."""

from __future__ import annotations

import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = ["temp_name", "write_atomically"]


def temp_name(file_name: str) -> str:
    """A unique, hidden name for a file being written; never a final name. Unique, so that two
    concurrent writers of the same file (a retried bundle) never share a temporary file."""
    return f".tmp-{uuid.uuid4().hex}-{file_name}"


def write_atomically(path: str, data: bytes) -> None:
    """Writes to a temporary name beside ``path``, then renames: readers see all or nothing."""
    directory, name = path.rsplit("/", 1)
    temp = f"{directory}/{temp_name(name)}"
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)
    FileSystems.rename([temp], [path])

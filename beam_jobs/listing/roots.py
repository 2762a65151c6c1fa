"""What every listing shares: the input root, an input's identity (its path relative to that
root), and the two outputs every listing transform has."""

from __future__ import annotations

import os
from typing import Final

from apache_beam.io.filesystem import FileMetadata

from beam_jobs.errors import BadInputError
from beam_jobs.paths import resolve_inside_root
from beam_jobs.records import DeadLetter, InputFile

__all__ = ["IGNORED", "LISTING", "listed_input", "normalize_root", "relative_filename"]


def normalize_root(root: str) -> str:
    """The input root with exactly one trailing separator, so prefixes compare safely."""
    if "://" not in root:
        root = os.path.abspath(os.path.expanduser(root))
    return root.rstrip("/") + "/"


def relative_filename(root: str, path: str) -> str:
    """``path`` relative to ``root``; ValueError if it is not under it.

    Only "/" separates names (on Linux, macOS and object stores alike): a backslash is a
    character of a folder's or file's name, so "a\\b/1.jpg" is in the folder "a\\b".
    """
    if not path.startswith(root):
        raise ValueError(f"{path!r} is not under the input root {root!r}")
    return path[len(root) :]


def listed_input(meta: FileMetadata, *, root: str, allow_outside_root: bool) -> InputFile | DeadLetter:
    """A listed file as an input named by its path relative to the root, or a dead letter when it
    resolves outside the root."""
    filename = relative_filename(root, meta.path)
    try:
        # For local trees this also catches a symlink inside the root that points out of it.
        resolve_inside_root(filename, root, allow_outside=allow_outside_root)
    except BadInputError as error:
        return DeadLetter(meta.path, error.stage, error.reason, error.detail)
    return InputFile(
        filename=filename, uri=meta.path, size=meta.size_in_bytes, mtime=meta.last_updated_in_seconds or None
    )


LISTING = "listing"  # the output of ListTree and ListInputList: InputFile | DeadLetter
IGNORED: Final = "ignored"  # their second output: the Ignored kind of each entry left out on purpose

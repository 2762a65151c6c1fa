"""Listing a class-per-folder tree on any Beam filesystem; input lists are input_lists.py's (imported from here too)."""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Literal

import apache_beam as beam
from apache_beam.io.filesystem import FileMetadata
from apache_beam.pvalue import TaggedOutput
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.listing.input_lists import (  # noqa: F401 (imported from here too)
    LIST_COLUMNS,
    ListInputList,
    ListRows,
    input_list_files,
    input_list_root,
    parse_input_list,
    row_to_input,
)
from beam_jobs.listing.names import is_hidden_name
from beam_jobs.listing.policy import (
    IMAGE_EXTENSIONS,
    Ignored,
    IgnoredEntry,
    classify_local,
    is_image_filename,
    walk_local,
)
from beam_jobs.listing.roots import IGNORED, LISTING, listed_input, normalize_root, relative_filename
from beam_jobs.listing.store_folders import list_one_level
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import list_tree

_LOG = logging.getLogger(__name__)

__all__ = [
    "IGNORED",
    "IMAGE_EXTENSIONS",
    "LISTING",
    "ListInputList",
    "ListRows",
    "ListTree",
    "is_image_filename",
    "normalize_root",
    "parse_input_list",
    "relative_filename",
    "row_to_input",
]


class ListTree(beam.PTransform):
    """Lists every image file under ``root`` (recursively) as an InputFile without label or split,
    one folder of the first level per unit of work (see ``_first_level``), by the policy of
    ``listing_policy`` (symlinked folders followed, hidden and special entries ignored).

    Labels and splits come from the folder layout, which the planner decides from the whole
    tree's depths and top folders. Returns the InputFile | DeadLetter PCollection; with
    ``with_ignored``, {LISTING: that, IGNORED: the Ignored kind of each entry left out}, to count.
    """

    def __init__(self, root: str, *, allow_outside_root: bool = False, with_ignored: bool = False) -> None:
        super().__init__()
        self._root = normalize_root(root)
        self._allow_outside_root = allow_outside_root
        self._with_ignored = with_ignored

    @no_annotations
    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection | dict[str, beam.PCollection]:
        """Lists the root's first level, spreads its folders over the workers, and sorts every entry found."""
        root, allow = self._root, self._allow_outside_root
        sorted_entries = (
            pipeline
            | "Root" >> beam.Create([root])
            | "FirstLevel" >> beam.FlatMap(_first_level, allow_outside_root=allow)
            # a folder directly under the root (its path), or one decided entry there: the units
            # listed in parallel
            | "SpreadFolders" >> beam.Reshuffle()
            # Every character of a path is literal ("photos [2024]"): fileio.MatchFiles would
            # read "[", "*" and "?" in it as glob syntax.
            | "ListUnits" >> beam.FlatMap(_list_unit, allow_outside_root=allow)
            # FileMetadata(path, size_in_bytes, last_updated_in_seconds) | DeadLetter | IgnoredEntry
            | "ToInputFile"
            >> beam.FlatMap(_sort_entry, root=root, allow_outside_root=allow).with_outputs(IGNORED, main=LISTING)
            # InputFile(filename, uri, size) | DeadLetter; IGNORED: the Ignored kind of each entry left out
        )
        if not self._with_ignored:
            return sorted_entries[LISTING]
        return {LISTING: sorted_entries[LISTING], IGNORED: sorted_entries[IGNORED]}


# Beam reads a tagged output's type from this (a bare TaggedOutput would join the main output's type).
IgnoredOutput = TaggedOutput[Literal["ignored"], str]


def _sort_entry(
    entry: FileMetadata | DeadLetter | IgnoredEntry, *, root: str, allow_outside_root: bool
) -> Iterator[InputFile | DeadLetter | IgnoredOutput]:
    if isinstance(entry, DeadLetter):
        yield entry
    elif isinstance(entry, IgnoredEntry):
        yield beam.pvalue.TaggedOutput(IGNORED, entry.kind)
    elif not is_image_filename(entry.path):
        yield beam.pvalue.TaggedOutput(IGNORED, Ignored.NOT_IMAGE)
    else:
        yield listed_input(entry, root=root, allow_outside_root=allow_outside_root)


# URIs of signed object-store URLs can be long; the csv module's default cap is 128 KiB a field.
csv.field_size_limit(16 << 20)


# The input list: a CSV or JSONL file naming each image and its label (the --manifest flag).
def _identity(path: str) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_dev, status.st_ino


def _first_level(root: str, *, allow_outside_root: bool = False) -> list:
    """The units a tree is listed in, in parallel: each folder directly under the root (listed
    recursively by one worker), and each entry there already decided (a file's FileMetadata, a
    DeadLetter, an IgnoredEntry).

    A local root is read here, by the policy of ``listing_policy``; an object store's with its
    delimiter listing (see ``store_folders``), whose files come with their metadata already. A
    scheme without one is listed as one recursive match of the whole root (paged and lazy, so
    memory holds paths only).
    """
    if "://" in root:
        level = list_one_level(root)
        if level is None:
            return [root]
        folders, files = level
        hidden = [
            IgnoredEntry(Ignored.HIDDEN)
            for path in [*folders, *(m.path for m in files)]
            if is_hidden_name(path.rstrip("/").rsplit("/", 1)[-1])
        ]
        return [
            *hidden,
            *(f for f in folders if not is_hidden_name(f.rstrip("/").rsplit("/", 1)[-1])),
            *(m for m in files if not is_hidden_name(m.path.rsplit("/", 1)[-1])),
        ]
    real_root, open_folders = os.path.realpath(root), frozenset({_identity(root)})
    units = []
    for name in sorted(os.listdir(root)):
        _, emitted, identity = classify_local(
            os.path.join(root, name),
            real_root=real_root,
            open_folders=open_folders,
            allow_outside_root=allow_outside_root,
        )
        units.append(os.path.join(root, name) if identity is not None else emitted)
    return units


def _list_unit(unit: str | FileMetadata | DeadLetter | IgnoredEntry, *, allow_outside_root: bool = False) -> Iterable:
    """The entries of one first-level unit: a folder's whole subtree, or the one decided entry."""
    if not isinstance(unit, str):
        return [unit]
    if "://" not in unit:
        root = os.path.dirname(unit)  # a local unit is always a folder directly under the root
        return walk_local(
            unit,
            real_root=os.path.realpath(root),
            open_folders=frozenset({_identity(root), _identity(unit)}),
            allow_outside_root=allow_outside_root,
        )
    # An object store's "folder/" marker objects (made by consoles and some tools) are no files;
    # one with no key under it is an empty folder, counted as on disk.
    return _markers_as_empty_folders(_without_hidden(_empty_markers_only(list_tree(unit)), unit=unit))


def _empty_markers_only(metas: Iterable[FileMetadata]) -> Iterator[FileMetadata]:
    """The keys of one store unit, with the "folder/" markers that have keys under them left out.

    S3 and GCS list keys in lexicographic order, so the keys under a marker come right after it:
    one key of lookahead decides, and memory stays one key (a unit may hold millions)."""
    pending: FileMetadata | None = None
    for meta in metas:
        if pending is not None and not meta.path.startswith(pending.path):
            yield pending
        pending = None
        if meta.path.endswith("/"):
            pending = meta
        else:
            yield meta
    if pending is not None:
        yield pending


def _markers_as_empty_folders(entries: Iterable) -> Iterator:
    """An empty folder's marker (see ``_empty_markers_only``) as the ignored entry it is."""
    for entry in entries:
        if isinstance(entry, FileMetadata) and entry.path.endswith("/"):
            yield IgnoredEntry(Ignored.EMPTY_FOLDER)
        else:
            yield entry


def _without_hidden(metas: Iterable[FileMetadata], *, unit: str) -> Iterator[FileMetadata | IgnoredEntry]:
    """Object-store files of one unit, with those under a hidden name left out: one IgnoredEntry
    per hidden folder (or file), as a local listing counts them. A store has no folders to skip,
    only keys; the unit's own name was decided by ``_first_level``."""
    seen: set[str] = set()
    base = unit.rstrip("/") + "/"
    for meta in metas:
        parts = relative_filename(base, meta.path).split("/")
        hidden = next((i for i, part in enumerate(parts) if is_hidden_name(part)), None)
        if hidden is None:
            yield meta
            continue
        prefix = "/".join(parts[: hidden + 1])
        if prefix not in seen:
            seen.add(prefix)
            yield IgnoredEntry(Ignored.HIDDEN)

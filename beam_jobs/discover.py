"""Listing inputs: a class-per-folder tree on any Beam filesystem, or a CSV/JSONL input list."""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath
import re
from collections.abc import Iterator
from functools import partial

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import BadInputError, JobError, Reason, Stage
from beam_jobs.paths import redact, resolve_inside_root
from beam_jobs.plan import is_valid_split_name
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import list_tree

__all__ = [
    "IMAGE_EXTENSIONS",
    "ListInputList",
    "ListTree",
    "is_image_filename",
    "normalize_root",
    "parse_input_list",
    "relative_filename",
]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"})


def is_image_filename(path: str) -> bool:
    """True for names with an image extension, in any case ("IMG_1.JPG"); hidden files are never images."""
    if "://" in path:
        path = re.split(r"[?#]", path, maxsplit=1)[0]  # A URL's query is not part of its name.
    name = posixpath.basename(path.replace("\\", "/"))
    if name.startswith("."):
        return False
    _, ext = posixpath.splitext(name)
    return ext.lower() in IMAGE_EXTENSIONS


def normalize_root(root: str) -> str:
    """The input root with exactly one trailing separator, so prefixes compare safely."""
    if "://" not in root:
        root = os.path.abspath(os.path.expanduser(root))
    return root.rstrip("/") + "/"


def relative_filename(root: str, path: str) -> str:
    """``path`` relative to ``root`` with "/" separators; ValueError if it is not under it."""
    if not path.startswith(root):
        raise ValueError(f"{path!r} is not under the input root {root!r}")
    return path[len(root):].replace("\\", "/")


def _listed_input(meta, *, root: str, allow_outside_root: bool) -> InputFile | DeadLetter:
    filename = relative_filename(root, meta.path)
    try:
        # For local trees this also catches a symlink inside the root that points out of it.
        resolve_inside_root(filename, root, allow_outside=allow_outside_root)
    except BadInputError as error:
        return DeadLetter(meta.path, error.stage, error.reason, error.detail)
    return InputFile(filename=filename, uri=meta.path, size=meta.size_in_bytes,
                     mtime=meta.last_updated_in_seconds or None)


class ListTree(beam.PTransform):
    """Lists every image file under ``root`` (recursively) as an InputFile without label or split.

    Labels and splits come from the folder layout, which the planner decides on the whole listing.
    """

    def __init__(self, root: str, *, allow_outside_root: bool = False) -> None:
        super().__init__()
        self._root = normalize_root(root)
        self._allow_outside_root = allow_outside_root

    def expand(self, pipeline):
        root = self._root
        return (
            pipeline
            | "Root" >> beam.Create([root])
            # Every character of the root is literal ("photos [2024]"): fileio.MatchFiles would
            # read "[", "*" and "?" in it as glob syntax.
            | "MatchFiles" >> beam.FlatMap(list_tree)
            # FileMetadata(path, size_in_bytes)
            | "KeepImages" >> beam.Filter(lambda meta: is_image_filename(meta.path))
            | "ToInputFile" >> beam.Map(_listed_input, root=root, allow_outside_root=self._allow_outside_root)
            # InputFile(filename, uri, size) | DeadLetter for a symlink that leads out of the root
        )


# The input list: a CSV or JSONL file naming each image and its label (the --manifest flag).
_REQUIRED_COLUMNS = ("uri", "label")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _bad_row(where: str, detail: str) -> DeadLetter:
    return DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, detail)


def _has_undecodable(values) -> bool:
    # Text is decoded with surrogateescape, so bytes that are not UTF-8 show up as lone surrogates.
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)


def _row_to_input(row: dict, *, root: str, where: str, allow_outside_root: bool) -> InputFile | DeadLetter:
    if _has_undecodable(row.values()):
        return _bad_row(where, "the row is not valid UTF-8")
    missing = [column for column in _REQUIRED_COLUMNS if not str(row.get(column) or "").strip()]
    if missing:
        return _bad_row(where, f"missing {', '.join(missing)}")
    entry = str(row["uri"]).strip()
    try:
        uri, filename = resolve_inside_root(entry, root, allow_outside=allow_outside_root)
    except BadInputError as error:
        return DeadLetter(where, error.stage, error.reason, error.detail)
    if not is_image_filename(uri):
        return _bad_row(where, f"{redact(entry)!r} does not have an image file extension")
    split = str(row.get("split") or "").strip() or None
    if split is not None and not is_valid_split_name(split):
        return _bad_row(where, f"split {split!r} cannot name shard files (letters, digits, '_' and '-' only)")
    return InputFile(filename=filename, uri=uri, label=str(row["label"]).strip(), split=split, origin=where)


def parse_input_list(data: bytes | str, *, list_uri: str, allow_outside_root: bool = False,
                     ) -> Iterator[InputFile | DeadLetter]:
    """Parses an input list: CSV (with a header naming uri, label and optionally split) or JSONL.

    Relative uris are relative to the list's folder, which is the input root: entries that
    leave it are refused unless ``allow_outside_root``. Each malformed row (missing or extra
    columns, bad JSON, bytes that are not UTF-8, an empty label) becomes a dead letter naming its
    line as ``<list>:<line>``; the other rows are unaffected. A BOM and CRLF line ends are fine.
    """
    list_uri = list_uri if "://" in list_uri else os.path.abspath(list_uri)
    root = list_uri.rsplit("/", 1)[0] + "/"
    text = data.decode("utf-8", errors="surrogateescape") if isinstance(data, bytes) else data
    if text.startswith("\ufeff"):
        text = text[1:]
    convert = partial(_row_to_input, root=root, allow_outside_root=allow_outside_root)
    if list_uri.lower().endswith(_JSON_SUFFIXES):
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{list_uri}:{number}"
            if _has_undecodable([line]):
                yield _bad_row(where, "the line is not valid UTF-8")
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("a line must be a JSON object")
            except ValueError as error:
                yield _bad_row(where, f"invalid JSON: {error}")
                continue
            yield convert(row, where=where)
        return
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    if not all(column in columns for column in _REQUIRED_COLUMNS):
        raise JobError(f"the input list {redact(list_uri)} must have a header row naming uri and label "
                       f"(got {columns!r})")
    for row in reader:
        where = f"{list_uri}:{reader.line_num}"
        if None in row or any(value is None for value in row.values()):
            yield _bad_row(where, "wrong number of columns")
            continue
        yield convert(row, where=where)


def _read_input_list(list_uri: str, *, allow_outside_root: bool) -> list[InputFile | DeadLetter]:
    try:
        with FileSystems.open(list_uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data = handle.read()
    except Exception as error:
        raise JobError(f"cannot read the input list {redact(list_uri)}: {redact(str(error))}") from None
    return list(parse_input_list(data, list_uri=list_uri, allow_outside_root=allow_outside_root))


class ListInputList(beam.PTransform):
    """Reads a CSV or JSONL input list into InputFiles (with labels) and dead letters for bad rows."""

    def __init__(self, list_uri: str, *, allow_outside_root: bool = False) -> None:
        super().__init__()
        # A bare "list.csv" is relative to the working directory, as on any command line.
        self._list_uri = list_uri if "://" in list_uri else os.path.abspath(list_uri)
        self._allow_outside_root = allow_outside_root

    def expand(self, pipeline):
        return (
            pipeline
            | "InputListPath" >> beam.Create([self._list_uri])
            | "ReadInputList" >> beam.FlatMap(_read_input_list, allow_outside_root=self._allow_outside_root)
            # InputFile(filename, uri, label, split) | DeadLetter
        )

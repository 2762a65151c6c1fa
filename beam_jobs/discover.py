"""Listing inputs: a class-per-folder tree on any Beam filesystem, or a CSV/JSONL input list."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import posixpath
import re
from collections.abc import Iterable, Iterator
from functools import partial

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import BadInputError, JobError, Reason, Stage
from beam_jobs.paths import is_http_url, redact, resolve_inside_root
from beam_jobs.plan import is_valid_split_name
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import list_tree, literal_pattern, match_literally
from beam_jobs.store_folders import list_one_level

_LOG = logging.getLogger(__name__)

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
    """True for names with an image extension, in any case ("IMG_1.JPG"); hidden files are never images.

    Only an http(s) URL has a query or fragment that is not part of its name; in a path on disk,
    gs:// or s3:// "?" and "#" are ordinary characters of a name ("dogs?/x.jpg").
    """
    if is_http_url(path):
        path = re.split(r"[?#]", path, maxsplit=1)[0]
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
    """Lists every image file under ``root`` (recursively) as an InputFile without label or split,
    one folder of the first level per unit of work (see ``_first_level``).

    Labels and splits come from the folder layout, which the planner decides from the whole
    tree's depths and top folders.
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
            | "FirstLevel" >> beam.FlatMap(_first_level)
            # a folder (or file) directly under the root: the units listed in parallel
            | "SpreadFolders" >> beam.Reshuffle()
            # Every character of a path is literal ("photos [2024]"): fileio.MatchFiles would
            # read "[", "*" and "?" in it as glob syntax.
            | "MatchFiles" >> beam.FlatMap(_list_unit)
            # FileMetadata(path, size_in_bytes, last_updated_in_seconds)
            | "KeepImages" >> beam.Filter(lambda meta: is_image_filename(meta.path))
            | "ToInputFile" >> beam.Map(_listed_input, root=root, allow_outside_root=self._allow_outside_root)
            # InputFile(filename, uri, size) | DeadLetter for a symlink that leads out of the root
        )


# URIs of signed object-store URLs can be long; the csv module's default cap is 128 KiB a field.
csv.field_size_limit(16 << 20)
# The input list: a CSV or JSONL file naming each image and its label (the --manifest flag).
_REQUIRED_COLUMNS = ("uri", "label")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _bad_row(where: str, detail: str) -> DeadLetter:
    return DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, detail)


def _has_undecodable(values) -> bool:
    # Text is decoded with surrogateescape, so bytes that are not UTF-8 show up as lone surrogates.
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)


def _row_to_input(row: dict, *, root: str, where: str, allow_outside_root: bool,
                  base: str | None = None) -> InputFile | DeadLetter:
    if _has_undecodable(row.values()):
        return _bad_row(where, "the row is not valid UTF-8")
    missing = [column for column in _REQUIRED_COLUMNS if not str(row.get(column) or "").strip()]
    if missing:
        return _bad_row(where, f"missing {', '.join(missing)}")
    entry = str(row["uri"]).strip()
    # A relative uri is relative to its own list file's folder (``base``); the relative name of
    # the input is taken against ``root``, common to every part of a pattern.
    located = entry
    if base and base != root and "://" not in entry and not entry.startswith("/") and "\x00" not in entry:
        located = base + entry
    try:
        uri, filename = resolve_inside_root(located, root, allow_outside=allow_outside_root)
    except BadInputError as error:
        return DeadLetter(where, error.stage, error.reason, error.detail)
    if not is_image_filename(uri):
        return _bad_row(where, f"{redact(entry)!r} does not have an image file extension")
    label = str(row["label"]).strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in label):
        # A tab or newline in a label would break every table and file that prints it.
        return _bad_row(where, f"label {label!r} contains control characters")
    split = str(row.get("split") or "").strip() or None
    if split is not None and not is_valid_split_name(split):
        return _bad_row(where, f"split {split!r} cannot name shard files (letters, digits, '_' and '-' only)")
    return InputFile(filename=filename, uri=uri, label=label, split=split, origin=where)


def _text_lines(data: bytes | str | Iterable[str]) -> Iterator[str]:
    """Lines with their ends (as csv needs), without a leading BOM, from bytes, text or a stream."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="surrogateescape")
    lines = iter(io.StringIO(data, newline="") if isinstance(data, str) else data)
    first = next(lines, None)
    if first is None:
        return
    yield first[1:] if first.startswith("\ufeff") else first
    yield from lines


def parse_input_list(data: bytes | str | Iterable[str], *, list_uri: str, allow_outside_root: bool = False,
                     root: str | None = None) -> Iterator[InputFile | DeadLetter]:
    """Parses an input list: CSV (with a header naming uri, label and optionally split) or JSONL.

    ``data`` may be the whole file or a stream of its lines: rows are parsed one at a time, so a
    list of any length needs the memory of one row. Relative uris are relative to the list's
    folder, which is the input root: entries that leave it are refused unless
    ``allow_outside_root``. Each malformed row (missing or extra columns, bad JSON, bytes that
    are not UTF-8, an empty label) becomes a dead letter naming its line as ``<list>:<line>``;
    the other rows are unaffected. A BOM and CRLF line ends are fine.
    """
    list_uri = list_uri if "://" in list_uri else os.path.abspath(list_uri)
    base = list_uri.rsplit("/", 1)[0] + "/"
    root = (root or base).rstrip("/") + "/"
    lines = _text_lines(data)
    convert = partial(_row_to_input, root=root, base=base, allow_outside_root=allow_outside_root)
    if list_uri.lower().endswith(_JSON_SUFFIXES):
        for number, line in enumerate(lines, start=1):
            line = line.rstrip("\r\n")
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
    reader = csv.DictReader(lines)
    try:
        columns = reader.fieldnames
    except csv.Error as error:
        raise JobError(f"the input list {redact(list_uri)} has an unreadable header row: {error}") from None
    if columns is None:
        return  # An empty part: sharded exporters write them; it lists nothing.
    if not all(column in columns for column in _REQUIRED_COLUMNS):
        raise JobError(f"the input list {redact(list_uri)} must have a header row naming uri and label "
                       f"(got {columns!r})")
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:  # A field over the size limit, a NUL byte: this row only.
            # csv counts a line once it is parsed: the failing one is the next.
            yield _bad_row(f"{list_uri}:{reader.line_num + 1}", f"unreadable CSV row: {error}")
            continue
        where = f"{list_uri}:{reader.line_num}"
        if None in row or any(value is None for value in row.values()):
            yield _bad_row(where, "wrong number of columns")
            continue
        yield convert(row, where=where)


def _read_input_list(list_uri: str, *, allow_outside_root: bool, root: str | None = None,
                     ) -> Iterator[InputFile | DeadLetter]:
    """Streams one input list file's rows: memory is one row, whatever the file's size."""
    try:
        handle = FileSystems.open(list_uri, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as error:
        raise JobError(f"cannot read the input list {redact(list_uri)}: {redact(str(error))}") from None
    with io.TextIOWrapper(handle, encoding="utf-8", errors="surrogateescape", newline="") as text:
        yield from parse_input_list(text, list_uri=list_uri, allow_outside_root=allow_outside_root, root=root)


def input_list_root(list_uri: str) -> str:
    """The folder that uris in an input list are relative to: the list's own folder, or for a
    pattern of many parts the folder before its first glob character, so that one file named
    from parts in different folders has one relative name (and dedup sees it once)."""
    if FileSystems.exists(list_uri):
        return list_uri.rsplit("/", 1)[0]
    fixed = re.split(r"[\[*?]", list_uri, maxsplit=1)[0]
    return fixed.rsplit("/", 1)[0]


def input_list_files(list_uri: str) -> list[str]:
    """The files an input-list argument names: the file itself when it exists (whatever characters
    its name holds), else every file its pattern matches ("lists/part-*.csv"), sorted."""
    if FileSystems.exists(list_uri):
        if re.search(r"[\[*?]", list_uri):
            others = [meta.path for meta in match_literally([list_uri])[0] if meta.path != list_uri]
            if others:
                _LOG.warning("the input list %s exists, so it is read alone; as a pattern its name would "
                             "also match %d other file(s), such as %s", redact(list_uri), len(others),
                             redact(others[0]))
        return [list_uri]
    return sorted(meta.path for meta in match_literally([list_uri])[0])


def _first_level(root: str) -> list:
    """The units a tree is listed in, in parallel: each folder directly under the root (listed
    recursively by one worker) and each file there.

    A local root is read with ``os.scandir``; an object store's with its delimiter listing (see
    ``store_folders``), whose files come with their metadata already. A scheme without one is
    listed as one recursive match of the whole root (paged and lazy, so memory holds paths only).
    """
    if "://" in root:
        level = list_one_level(root)
        if level is None:
            return [root]
        folders, files = level
        return [*folders, *files]
    units = []
    with os.scandir(root) as entries:
        for entry in entries:
            # Like os.walk, which the listing uses below the first level: no symlinked folders.
            if entry.is_dir(follow_symlinks=False) or entry.is_file():
                units.append(entry.path)
    return sorted(units)


def _list_unit(unit) -> list:
    """The files of one first-level unit: a folder's whole subtree, or a single file."""
    if isinstance(unit, FileMetadata):  # an object-store file, listed with its metadata
        return [unit]
    if "://" not in unit and os.path.isfile(unit):
        return match_literally([literal_pattern(unit)])[0]
    # An object store's "folder/" marker objects (made by consoles and some tools) are no files.
    return [meta for meta in list_tree(unit) if not meta.path.endswith("/")]


class ListInputList(beam.PTransform):
    """Reads CSV or JSONL input lists into InputFiles (with labels) and dead letters for bad rows.

    The argument may name one file or a pattern of many ("lists/part-*.csv"); the files are read
    in parallel, each streamed row by row.
    """

    def __init__(self, list_uri: str, *, allow_outside_root: bool = False) -> None:
        super().__init__()
        # A bare "list.csv" is relative to the working directory, as on any command line.
        self._list_uri = list_uri if "://" in list_uri else os.path.abspath(list_uri)
        self._allow_outside_root = allow_outside_root
        self._root = input_list_root(self._list_uri)

    def expand(self, pipeline):
        return (
            pipeline
            | "InputListArgument" >> beam.Create([self._list_uri])
            | "InputListFiles" >> beam.FlatMap(input_list_files)
            # path of one input list file
            | "SpreadListFiles" >> beam.Reshuffle()
            | "ReadInputList" >> beam.FlatMap(_read_input_list, allow_outside_root=self._allow_outside_root,
                                              root=self._root)
            # InputFile(filename, uri, label, split) | DeadLetter
        )

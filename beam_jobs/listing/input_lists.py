"""Listing inputs from CSV/JSONL input lists, or from a PCollection of rows: each row an input."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from functools import partial

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.errors import BadInputError, JobError, Reason, Stage
from beam_jobs.listing.annotations import ANNOTATION_COLUMNS, annotations_from_row
from beam_jobs.listing.names import clean_group, clean_label, clean_split_name
from beam_jobs.listing.policy import (
    check_listed_file,
    is_image_filename,
)
from beam_jobs.listing.roots import IGNORED, LISTING
from beam_jobs.paths import redact, resolve_inside_root
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.storage import match_literally

_LOG = logging.getLogger(__name__)

__all__ = [
    "LIST_COLUMNS",
    "ListInputList",
    "ListRows",
    "input_list_files",
    "input_list_root",
    "parse_input_list",
    "row_to_input",
]


_REQUIRED_COLUMNS = ("uri", "label")
# Every column the job reads. Any other is refused, not ignored: a misspelt "object" or "boxes"
# would otherwise give an image stored with no boxes, and a dataset that looks whole.
LIST_COLUMNS = ("uri", "label", "split", "group", *ANNOTATION_COLUMNS)


def _unknown_columns(columns: Iterable[object]) -> str | None:
    unknown = sorted(str(column) for column in columns if column not in LIST_COLUMNS)
    if not unknown:
        return None
    return (
        f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; a list's columns are "
        f"{', '.join(LIST_COLUMNS)} (another column is refused, since a misspelt one would be lost silently)"
    )


_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _bad_row(where: str, detail: str) -> DeadLetter:
    return DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, detail)


def _has_undecodable(values: Iterable[object]) -> bool:
    # Text is decoded with surrogateescape, so bytes that are not UTF-8 show up as lone surrogates.
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)


# Why a JSON number must be written as text, per column.
_NUMBER_ADVICE = {
    "label": "class ids are the positions of the sorted label names, so numbers would not keep their values",
    "split": "split names are text, as the tree's split folders are",
    "uri": "a uri is a path or a URL",
}


def _json_value_not_text(row: dict) -> str | None:
    """Why a JSON row's uri, label or split is refused when it is not text, or None.

    A list or an object would become the text of its repr ("['cat']"), a class nobody named. A
    number would become its digits, whose id is its place in text order ('10' before '2'), not
    its value: a dataset silently different from the user's numbering. CSV values are always text.
    """
    # bytes: only a user's rows (ConvertImages) can hold them; str() would make a class "b'cat'".
    odd = [
        column
        for column in ("uri", "label", "split", "group")
        if isinstance(row.get(column), (list, dict, bool, bytes))
    ]
    if odd:
        return f"{', '.join(odd)} must be text (got {', '.join(repr(row[c]) for c in odd)})"
    for column in ("label", "uri", "split"):
        value = row.get(column)
        if isinstance(value, (int, float)):
            return (
                f"{column} {json.dumps(value)} is a JSON number; write it as text "
                f"({json.dumps(str(json.dumps(value)))}): {_NUMBER_ADVICE[column]}"
            )
    return None


def _row_to_input(
    row: dict, *, root: str, where: str, allow_outside_root: bool, base: str | None = None, from_csv: bool = False
) -> InputFile | DeadLetter:
    if _has_undecodable(row.values()):
        return _bad_row(where, "the row is not valid UTF-8")
    unknown = _unknown_columns(row)
    if unknown:
        return _bad_row(where, unknown)
    try:
        annotations = annotations_from_row(row, where=where, from_csv=from_csv)
    except BadInputError as error:
        return DeadLetter(where, error.stage, error.reason, error.detail)
    # An annotated row (labels, objects) needs no one label.
    required = ("uri",) if annotations is not None else _REQUIRED_COLUMNS
    missing = [
        column for column in required if row.get(column) is None or (column == "uri" and not str(row[column]).strip())
    ]
    if missing:
        return _bad_row(where, f"missing {', '.join(missing)}")
    not_text = _json_value_not_text(row)
    if not_text:
        return _bad_row(where, not_text)
    # Taken literally, as a tree's names are: "cat .jpg" and " cat.jpg" are file names a disk may
    # hold, and stripping them made such a listed file a read_error dead letter.
    entry = str(row["uri"])

    def located(entry: str) -> str:
        # A relative uri is relative to its own list file's folder (``base``); the relative name of
        # the input is taken against ``root``, common to every part of a pattern.
        if base and base != root and "://" not in entry and not entry.startswith("/") and "\x00" not in entry:
            return base + entry
        return entry

    try:
        uri, filename = resolve_inside_root(located(entry), root, allow_outside=allow_outside_root)
        if annotations is not None and row.get("mask") not in (None, ""):
            if not isinstance(row["mask"], str):
                return _bad_row(where, f"mask must be the path of a PNG file (got {row['mask']!r})")
            mask_uri, _ = resolve_inside_root(located(row["mask"]), root, allow_outside=allow_outside_root)
            annotations = replace(annotations, mask_uri=mask_uri)
        # The one naming policy of tree folders too: "café" (NFC or NFD) and "cat " name one class.
        label = (
            None
            if annotations is not None and row.get("label") in (None, "")
            else clean_label(row["label"], where=where)
        )
        raw_split = str(row.get("split") or "").strip()
        split = clean_split_name(raw_split, where=where) if raw_split else None
    except BadInputError as error:
        return DeadLetter(where, error.stage, error.reason, error.detail)
    if not is_image_filename(uri):
        return _bad_row(where, f"{redact(entry)!r} does not have an image file extension")
    if "://" not in uri:
        refused = check_listed_file(uri)  # a FIFO, a folder, a dangling symlink: never opened
        if refused is not None:
            return DeadLetter(where, refused.stage, refused.reason, f"{entry!r}: {refused.detail}")
    group = clean_group(row.get("group"))  # one group per value, however spelled
    return InputFile(
        filename=filename, uri=uri, label=label, split=split, origin=where, annotations=annotations, user_group=group
    )


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


def parse_input_list(
    data: bytes | str | Iterable[str], *, list_uri: str, allow_outside_root: bool = False, root: str | None = None
) -> Iterator[InputFile | DeadLetter]:
    """Parses an input list: CSV (with a header naming uri, label and optionally split) or JSONL.

    ``data`` may be the whole file or a stream of its lines: rows are parsed one at a time, so a
    list of any length needs the memory of one row. Relative uris are relative to the list's
    folder, which is the input root: entries that leave it are refused unless
    ``allow_outside_root``. Each malformed row (missing or extra columns, bad JSON, bytes that
    are not UTF-8) becomes a dead letter naming its line as ``<list>:<line>``, and so does a row
    whose label or split the naming policy refuses (``bad_label``: blank, control characters) or
    whose local file is no regular file (a FIFO, a folder, a dangling symlink), or, in JSONL, whose
    uri, label or split is not text (a number, a list, an object, a boolean); the other rows are
    unaffected. Labels are NFC-normalised and stripped, split names lower-cased (``names``). A BOM
    and CRLF line ends are fine.
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
    if "uri" not in columns or not any(column in columns for column in ("label", *ANNOTATION_COLUMNS)):
        raise JobError(
            f"the input list {redact(list_uri)} must have a header row naming uri and label "
            f"(or labels or objects) (got {columns!r})"
        )
    unknown = _unknown_columns(columns)
    if unknown:
        raise JobError(f"the input list {redact(list_uri)} has an {unknown}")
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
        yield convert(row, where=where, from_csv=True)


def _read_input_list(
    list_uri: str,
    *,
    allow_outside_root: bool,
    root: str | None = None,
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
                _LOG.warning(
                    "the input list %s exists, so it is read alone; as a pattern its name would "
                    "also match %d other file(s), such as %s",
                    redact(list_uri),
                    len(others),
                    redact(others[0]),
                )
        return [list_uri]
    return sorted(meta.path for meta in match_literally([list_uri])[0])


class ListInputList(beam.PTransform):
    """Reads CSV or JSONL input lists into InputFiles (with labels) and dead letters for bad rows.

    The argument may name one file or a pattern of many ("lists/part-*.csv"); the files are read
    in parallel, each streamed row by row. Returns the InputFile | DeadLetter PCollection; with
    ``with_ignored``, {LISTING: that, IGNORED: nothing (every row is used or dead-lettered)}, the
    shape of ListTree's.
    """

    def __init__(self, list_uri: str, *, allow_outside_root: bool = False, with_ignored: bool = False) -> None:
        super().__init__()
        self._with_ignored = with_ignored
        # A bare "list.csv" is relative to the working directory, as on any command line.
        self._list_uri = list_uri if "://" in list_uri else os.path.abspath(list_uri)
        self._allow_outside_root = allow_outside_root
        self._root = input_list_root(self._list_uri)

    @no_annotations
    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection | dict[str, beam.PCollection]:
        """Expands the argument into its list files and reads each on a worker of its own, row by row."""
        listing = (
            pipeline
            | "InputListArgument" >> beam.Create([self._list_uri])
            | "InputListFiles" >> beam.FlatMap(input_list_files)
            # path of one input list file
            | "SpreadListFiles" >> beam.Reshuffle()
            | "ReadInputList"
            >> beam.FlatMap(_read_input_list, allow_outside_root=self._allow_outside_root, root=self._root)
            # InputFile(filename, uri, label, split) | DeadLetter
        )
        if not self._with_ignored:
            return listing
        return {LISTING: listing, IGNORED: pipeline | "NothingIgnored" >> beam.Create([])}


def row_to_input(row: object, *, root: str, allow_outside_root: bool = False) -> InputFile | DeadLetter:
    """One row of a user's PCollection (a dict, or a ``beam.Row``, with uri, label and optionally
    split) as an input, by the same rules as a line of an input list; a bad row is a dead letter
    named by its uri."""
    if hasattr(row, "_asdict"):
        fields = row._asdict()
    elif isinstance(row, Mapping):
        fields = dict(row)
    else:
        return _bad_row(
            f"row {row!r}"[:500], f"a row is a mapping (or a beam.Row) with uri and label, not a {type(row).__name__}"
        )
    where = str(fields.get("uri") or f"row {fields!r}")[:500]
    return _row_to_input(fields, root=root.rstrip("/") + "/", where=where, allow_outside_root=allow_outside_root)


class ListRows(beam.PTransform):
    """A PCollection of rows (uri, label[, split]) as InputFile | DeadLetter, shaped as ListTree's
    output with ``with_ignored``: relative uris, and each input's relative name, are relative to
    ``root``."""

    def __init__(self, root: str, *, allow_outside_root: bool = False) -> None:
        super().__init__()
        self._root = root
        self._allow_outside_root = allow_outside_root

    @no_annotations
    def expand(self, rows: beam.PCollection) -> dict[str, beam.PCollection]:
        """Turns each row into an input or a dead letter; IGNORED stays empty, as no row is left out on purpose."""
        listing = rows | "RowsToInputs" >> beam.Map(
            row_to_input, root=self._root, allow_outside_root=self._allow_outside_root
        )
        return {LISTING: listing, IGNORED: rows.pipeline | "NothingIgnored" >> beam.Create([])}

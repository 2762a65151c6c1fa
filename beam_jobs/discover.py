"""Listing inputs: a class-per-folder tree on any Beam filesystem, or a CSV/JSONL manifest."""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import Reason, Stage
from beam_jobs.records import DeadLetter, InputFile

__all__ = [
    "IMAGE_EXTENSIONS",
    "ListManifest",
    "ListTree",
    "is_image_filename",
    "normalize_root",
    "parse_manifest",
    "relative_filename",
]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"})


def is_image_filename(path: str) -> bool:
    """True for names with an image extension, in any case ("IMG_1.JPG"); hidden files are never images."""
    name = posixpath.basename(path.replace("\\", "/"))
    if name.startswith("."):
        return False
    _, ext = posixpath.splitext(name)
    return ext.lower() in IMAGE_EXTENSIONS


def normalize_root(root: str) -> str:
    """The input root with exactly one trailing separator, so prefixes compare safely."""
    if "://" not in root:
        root = os.path.abspath(root)
    return root.rstrip("/") + "/"


def relative_filename(root: str, path: str) -> str:
    """``path`` relative to ``root`` with "/" separators; ValueError if it is not under it."""
    if not path.startswith(root):
        raise ValueError(f"{path!r} is not under the input root {root!r}")
    return path[len(root):].replace("\\", "/")


class ListTree(beam.PTransform):
    """Lists every image file under ``root`` (recursively) as an InputFile without label or split.

    Labels and splits come from the folder layout, which the planner decides on the whole listing.
    """

    def __init__(self, root: str) -> None:
        super().__init__()
        self._root = normalize_root(root)

    def expand(self, pipeline):
        root = self._root
        return (
            pipeline
            | "MatchFiles" >> fileio.MatchFiles(FileSystems.join(root, "**"))
            # FileMetadata(path, size_in_bytes)
            | "KeepImages" >> beam.Filter(lambda meta: is_image_filename(meta.path))
            | "ToInputFile" >> beam.Map(
                lambda meta: InputFile(
                    filename=relative_filename(root, meta.path), uri=meta.path, size=meta.size_in_bytes
                )
            )
            # InputFile(filename, uri, size)
        )


_REQUIRED_COLUMNS = ("uri", "label")


def _resolve(base: str, uri: str) -> tuple[str, str]:
    """Returns (full uri, filename relative to the manifest's folder when it is inside it)."""
    if "://" in uri or uri.startswith("/"):
        full = uri
    else:
        # Plain "/" joining: FileSystems.join would need the remote filesystem's package installed
        # just to parse a name, and every Beam filesystem uses "/" separators.
        full = f"{base.rstrip('/')}/{uri}" if base else uri
    filename = full[len(base):].lstrip("/") if base and full.startswith(base.rstrip("/") + "/") else full
    return full, filename


def _row_to_input(row: dict, *, base: str, where: str) -> InputFile | DeadLetter:
    missing = [column for column in _REQUIRED_COLUMNS if not str(row.get(column) or "").strip()]
    if missing:
        return DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, f"missing {', '.join(missing)}")
    uri, filename = _resolve(base, str(row["uri"]).strip())
    split = str(row.get("split") or "").strip() or None
    if not is_image_filename(uri):
        return DeadLetter(uri, Stage.LIST, Reason.BAD_MANIFEST_ROW, f"{where}: not an image file name")
    return InputFile(filename=filename, uri=uri, label=str(row["label"]).strip(), split=split)


def parse_manifest(text: str, *, manifest_uri: str) -> Iterator[InputFile | DeadLetter]:
    """Parses a CSV (with a header naming uri, label and optionally split) or a JSONL manifest.

    Relative uris are relative to the manifest's folder. A malformed row becomes a dead letter
    that names its line; the other rows are unaffected.
    """
    base = manifest_uri.rsplit("/", 1)[0] if "/" in manifest_uri else ""
    if text.startswith("\ufeff"):
        text = text[1:]
    if manifest_uri.lower().endswith((".jsonl", ".json", ".ndjson")):
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{manifest_uri}:{number}"
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("a line must be a JSON object")
            except ValueError as error:
                yield DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, f"invalid JSON: {error}")
                continue
            yield _row_to_input(row, base=base, where=where)
        return
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    if not all(column in columns for column in _REQUIRED_COLUMNS):
        raise ValueError(f"the manifest {manifest_uri} must have a header row naming uri and label (got {columns!r})")
    for row in reader:
        where = f"{manifest_uri}:{reader.line_num}"
        if None in row or any(value is None for value in row.values()):
            yield DeadLetter(where, Stage.LIST, Reason.BAD_MANIFEST_ROW, "wrong number of columns")
            continue
        yield _row_to_input(row, base=base, where=where)


def _read_manifest(manifest_uri: str) -> Iterable[InputFile | DeadLetter]:
    with FileSystems.open(manifest_uri) as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"the manifest {manifest_uri} is not UTF-8 ({error})") from None
    return list(parse_manifest(text, manifest_uri=manifest_uri))


class ListManifest(beam.PTransform):
    """Reads a CSV or JSONL manifest into InputFiles (with labels) and dead letters for bad rows."""

    def __init__(self, manifest_uri: str) -> None:
        super().__init__()
        self._manifest_uri = manifest_uri

    def expand(self, pipeline):
        return (
            pipeline
            | "ManifestPath" >> beam.Create([self._manifest_uri])
            | "ReadManifest" >> beam.FlatMap(_read_manifest)
            # InputFile(filename, uri, label, split) | DeadLetter
        )

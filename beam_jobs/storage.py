"""File operations on any Beam filesystem that take every path literally, and atomic small-file writes."""

from __future__ import annotations

import os
import re
import uuid
import warnings

from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems

__all__ = [
    "bucket_problem",
    "concatenate_atomically",
    "delete_exactly",
    "list_folder",
    "list_tree",
    "literal_pattern",
    "match_literally",
    "temp_name",
    "write_atomically",
]

# Beam's match() reads "*", "?" and "[...]" as glob syntax everywhere in a pattern, and has no
# escape character. A one-character class does the quoting: "[[]" matches "[" alone.
_GLOB_CHARS = re.compile(r"[\[*?]")
# Filesystems whose delete() expands its arguments as patterns (local disk, whose scheme() is
# None, and GCS match before deleting); the others (S3) take each path literally, and a quoted
# path would name nothing there.
_DELETE_EXPANDS_PATTERNS = frozenset({None, "file", "gs"})


def literal_pattern(path: str) -> str:
    """``path`` as a Beam match pattern that matches exactly that path, whatever characters it holds
    ("photos [2024]", "what?.jpg"); the scheme is left alone."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        scheme, rest = "", path
    quoted = _GLOB_CHARS.sub(lambda m: f"[{m.group(0)}]", rest)
    return f"{scheme}{sep}{quoted}"


def match_literally(patterns: list[str], limit: int | None = None) -> list[list[FileMetadata]]:
    """``FileSystems.match``, for patterns made with ``literal_pattern``: Python's re warns that the
    "[[]" class Beam builds for a quoted "[" might one day be read as a nested set; it is not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        results = FileSystems.match(patterns, limits=None if limit is None else [limit] * len(patterns))
        return [list(result.metadata_list) for result in results]


def list_folder(folder: str) -> list[FileMetadata]:
    """The files directly inside ``folder`` (not in its subfolders), read literally."""
    return match_literally([FileSystems.join(literal_pattern(folder.rstrip("/")), "*")])[0]


def list_tree(folder: str, *, limit: int | None = None) -> list[FileMetadata]:
    """Every file under ``folder`` at any depth (the first ``limit`` found), read literally."""
    return match_literally([FileSystems.join(literal_pattern(folder.rstrip("/")), "**")], limit)[0]


def delete_exactly(paths: list[str]) -> None:
    """Deletes exactly these files, whatever characters their names hold.

    ``FileSystems.delete`` matches its arguments as patterns on some filesystems: there a name
    with "[" deletes nothing (or, worse, a different file), so such names are quoted for those
    filesystems only.
    """
    if not paths:
        return
    quoted = []
    for path in paths:
        expands = FileSystems.get_filesystem(path).scheme() in _DELETE_EXPANDS_PATTERNS
        quoted.append(literal_pattern(path) if expands and _GLOB_CHARS.search(path) else path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        FileSystems.delete(quoted)


def temp_name(file_name: str) -> str:
    """A unique, hidden name for a file being written; never a final name. Unique, so that two
    concurrent writers of the same file (a retried bundle) never share a temporary file."""
    return f".tmp-{uuid.uuid4().hex}-{file_name}"


def _chunks(sources: list[str], chunk_bytes: int):
    for source in sources:
        with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            while chunk := handle.read(chunk_bytes):
                yield chunk


def concatenate_atomically(path: str, sources: list[str], *, chunk_bytes: int = 1 << 20) -> None:
    """Writes the files ``sources``, in order, into ``path`` (all or nothing), streaming: memory
    stays at one chunk however large the sources are."""
    chunks = _chunks(sources, chunk_bytes)
    first = next(chunks, None)
    if first is None:
        write_atomically(path, b"")
        return
    directory, name = path.rsplit("/", 1)
    temp = f"{directory}/{temp_name(name)}"
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(first)
        for chunk in chunks:
            out.write(chunk)
    FileSystems.rename([temp], [path])


def write_atomically(path: str, data: bytes) -> None:
    """Writes to a temporary name beside ``path``, then renames: readers see all or nothing."""
    directory, name = path.rsplit("/", 1)
    temp = f"{directory}/{temp_name(name)}"
    if data:
        with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.write(data)
    else:
        _create_empty(temp)
    FileSystems.rename([temp], [path])


def _create_empty(path: str) -> None:
    """Creates a zero-byte file, on S3 too.

    Beam's S3 writer always completes a multipart upload, even one with no parts, and S3 refuses
    that ("You must specify at least one part"), so an empty object (an empty dead_letters.jsonl)
    could not be written through ``FileSystems.create`` there. It is put in one request instead,
    with the client and options Beam's own S3 filesystem uses.
    """
    filesystem = FileSystems.get_filesystem(path)
    if filesystem.scheme() != "s3":
        FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED).close()
        return
    from apache_beam.io.aws import s3io  # pylint: disable=import-outside-toplevel  # Only with [aws].

    bucket, key = s3io.parse_s3_path(path)
    client = s3io.S3IO(options=_s3_options(filesystem)).client
    client.client.put_object(Bucket=bucket, Key=key, Body=b"")


def bucket_problem(uri: str) -> str | None:
    """Why the S3 bucket of ``uri`` cannot be listed ("bucket x does not exist"), or None.

    A listing of a bucket that does not exist comes back empty from Beam's S3 filesystem, which
    would read as "no files found"; the bucket's own answer is the clearer message.
    """
    if not uri.lower().startswith("s3://"):
        return None
    from apache_beam.io.aws import s3io  # pylint: disable=import-outside-toplevel  # Only with [aws].

    bucket, _ = s3io.parse_s3_path(uri if "/" in uri[5:] else uri + "/", object_optional=True)
    filesystem = FileSystems.get_filesystem(uri)
    client = s3io.S3IO(options=_s3_options(filesystem)).client
    try:
        client.client.head_bucket(Bucket=bucket)
    except Exception as error:  # botocore's ClientError; its code says which problem
        code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket"):
            return f"bucket {bucket} does not exist"
        return f"bucket {bucket} cannot be listed ({code or type(error).__name__})"
    return None


def connect_anonymously_to_a_gcs_emulator() -> None:
    """With STORAGE_EMULATOR_HOST set (a GCS emulator such as fake-gcs-server), connects to gs://
    anonymously at once, as google-cloud-storage itself does for an emulator.

    Beam would first look for Google credentials: google.auth.default() fails where there are
    none, and Beam retries it with back-off, about 22 s in every process (the job's and each
    worker's), before it connects anonymously anyway. Beam has no option to skip that lookup, so
    its once-per-process answer is set here, to none, ahead of it. It is a private attribute of
    Beam's: if a release renames it, this does nothing and the wait comes back, nothing breaks.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    try:
        from apache_beam.internal.gcp import auth  # pylint: disable=import-outside-toplevel  # Only with [gcp].
    except ImportError:
        return
    credentials = getattr(auth, "_Credentials", None)
    if credentials is None or not hasattr(credentials, "_credentials_init"):
        return
    with credentials._credentials_lock:  # pylint: disable=protected-access
        if not credentials._credentials_init:  # pylint: disable=protected-access
            credentials._credentials = None  # pylint: disable=protected-access
            credentials._credentials_init = True  # pylint: disable=protected-access


# Every module of the job that touches files imports this one, in the job's process and in each
# worker (which imports them to run the job's functions), so this runs before any gs:// access.
connect_anonymously_to_a_gcs_emulator()


def _s3_options(filesystem: object) -> object:
    """The options Beam's S3 filesystem was made with (its private ``_options``; Beam offers no
    public accessor, and a client made without them would miss the endpoint and keys)."""
    return filesystem._options  # type: ignore[attr-defined]  # pylint: disable=protected-access

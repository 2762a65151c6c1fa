"""The commit point of a versioned dataset: one conditional write of OUT/dataset_info.json.

Data files are immutable and every version's manifest is kept in OUT/versions/, so the only thing
a commit changes is the root manifest. It is replaced in ONE operation that carries a
precondition ("still the manifest I read"), so of two committers over the same parent exactly one
wins and the other learns it (CommitConflictError) instead of silently replacing a version it
never saw. Each filesystem has its own conditional write:

- local disk: an exclusive ``fcntl`` lock on OUT/.commit.lock, the root's sha256 compared under
  it, then a temp file fsynced and ``os.replace``d (the folder fsynced too);
- gs://: one upload with ``if_generation_match`` (0: the object must not exist);
- s3://: one ``put_object`` with ``IfMatch`` (the ETag read) or ``IfNoneMatch='*'``.

Beam's FileSystems API has no conditional write, so the object stores are reached through the
very clients Beam's GCS and S3 filesystems build from the pipeline options (same endpoint,
credentials, emulator), as beam_jobs/listing/store_folders.py does. Other schemes are refused: a plain
overwrite there would let two commits silently lose one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import re
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import JobError

if TYPE_CHECKING:
    from apache_beam.io.aws.s3filesystem import S3FileSystem
    from apache_beam.io.gcp.gcsfilesystem import GCSFileSystem

__all__ = [
    "COMMIT_LOCK_NAME",
    "CommitConflictError",
    "Current",
    "DATASET_INFO",
    "VERSION_KEYS",
    "VERSIONS_DIR",
    "commit_version",
    "create_if_absent",
    "manifest_bytes",
    "read_current",
    "version_file",
]

DATASET_INFO = "dataset_info.json"
VERSIONS_DIR = "versions"
COMMIT_LOCK_NAME = ".commit.lock"
# The keys a commit sets; everything else in a manifest is the dataset's content.
VERSION_KEYS = ("version", "parent_version", "committed_at", "change")
_VERSION_FILE = re.compile(r"^(\d{8})\.json$")
# Temp files of the local commit (see _LocalStore); a killed committer can leave one behind.
_LOCAL_TEMP = re.compile(r"^\.tmp-[0-9a-f]{32}-(dataset_info\.json|\d{8}\.json)$")


class CommitConflictError(JobError):
    """Someone committed another version since the caller read the current one: nothing was
    committed, and the version now current is named."""


@dataclasses.dataclass(frozen=True)
class Current:
    """The root manifest as read, and the precondition for replacing it.

    ``token`` is the filesystem's own notion of "unchanged": local disk, the bytes' sha256 (None
    when absent); gs://, the object generation (0 when absent); s3://, the ETag (None when absent).
    """

    manifest: dict | None
    data: bytes | None
    token: object

    @property
    def version(self) -> int | None:
        """The current version; a manifest of an older release (no ``version`` key) is version 1."""
        if self.manifest is None:
            return None
        return int(self.manifest.get("version", 1))


def version_file(version: int) -> str:
    """The history manifest of ``version``, relative to OUT (``versions/00000003.json``)."""
    return f"{VERSIONS_DIR}/{version:08d}.json"


def manifest_bytes(manifest: dict) -> bytes:
    """A manifest as the job writes it: sorted keys, indented, UTF-8, one final newline."""
    return (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def utc_timestamp(now: datetime.datetime | None = None) -> str:
    """ISO-8601 UTC to the second, as ``committed_at`` holds it (``2026-12-01T13:30:00Z``)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _join(output_dir: str, relative: str) -> str:
    return FileSystems.join(output_dir, relative)


# --- Per-filesystem stores -------------------------------------------------------------------


class _LocalStore:
    """Local disk. The comparison and the replace happen under one exclusive fcntl lock that
    every committer of the folder takes, so they are one step to any other committer; readers
    need no lock, since os.replace swaps the name atomically."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        os.makedirs(self.output_dir, exist_ok=True)
        with open(os.path.join(self.output_dir, COMMIT_LOCK_NAME), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                self._remove_dead_temps()
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _remove_dead_temps(self) -> None:
        # Under the lock no other commit is under way: a temp file of ours is a killed committer's.
        for folder in (self.output_dir, os.path.join(self.output_dir, VERSIONS_DIR)):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(folder):
                    if _LOCAL_TEMP.match(name):
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(os.path.join(folder, name))

    def read(self, path: str) -> tuple[bytes | None, object]:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def replace_if(self, path: str, data: bytes, token: object) -> bool:
        if self.read(path)[1] != token:  # Called under guard(): no commit can slip in between.
            return False
        self.write(path, data)
        return True

    def write_if_absent(self, path: str, data: bytes) -> bool:
        if os.path.exists(path):
            return False
        self.write(path, data)
        return True

    def write(self, path: str, data: bytes) -> None:
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}-{name}")
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        # The rename is durable only once the folder's entry is on disk.
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


class _GcsStore:
    """gs://: generations are GCS's own compare-and-swap; one upload carries the precondition."""

    def __init__(self, filesystem: GCSFileSystem) -> None:
        # google.cloud.storage.Client that Beam built from the pipeline options (see store_folders).
        self.client = filesystem._gcsIO().client  # pylint: disable=protected-access

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        yield

    def _blob(self, path: str):
        bucket, _, name = path[len("gs://") :].partition("/")
        return self.client.bucket(bucket).blob(name)

    def read(self, path: str) -> tuple[bytes | None, object]:
        from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

        blob = self._blob(path)
        try:
            # One request: the bytes and, from its X-Goog-Generation header, the generation they are.
            data = blob.download_as_bytes()
        except exceptions.NotFound:
            return None, 0
        if blob.generation is None:
            raise JobError(f"{path}: the store sent no generation with the object; cannot commit safely")
        return data, int(blob.generation)

    def _upload(self, path: str, data: bytes, generation: int | None) -> bool:
        from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

        try:
            self._blob(path).upload_from_string(data, content_type="application/json", if_generation_match=generation)
        except exceptions.PreconditionFailed:
            return False
        return True

    def replace_if(self, path: str, data: bytes, token: object) -> bool:
        return self._upload(path, data, int(cast(int, token)))  # the generation read_token gave

    def write_if_absent(self, path: str, data: bytes) -> bool:
        return self._upload(path, data, 0)

    def write(self, path: str, data: bytes) -> None:
        self._upload(path, data, None)


# S3's answers to a failed precondition: 412, and 409 when another conditional write to the key
# was under way at the same moment (AWS asks to read again and retry: a conflict for us too).
_S3_CONFLICT_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


class _S3Store:
    """s3://: one put_object with IfMatch / IfNoneMatch (S3's conditional writes)."""

    def __init__(self, filesystem: S3FileSystem) -> None:
        from apache_beam.io.aws import s3io  # pylint: disable=import-outside-toplevel  # Only with [aws].

        self.client = s3io.S3IO(options=filesystem._options).client.client  # pylint: disable=protected-access

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        yield

    @staticmethod
    def _key(path: str) -> tuple[str, str]:
        bucket, _, key = path[len("s3://") :].partition("/")
        return bucket, key

    def read(self, path: str) -> tuple[bytes | None, object]:
        bucket, key = self._key(path)
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None, None
        # The body and the ETag come in the same response: they describe the same object.
        return response["Body"].read(), response["ETag"]

    def _put(self, path: str, data: bytes, **condition: str) -> bool:
        from botocore.exceptions import ClientError  # pylint: disable=import-outside-toplevel

        bucket, key = self._key(path)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json", **condition)
        except ClientError as error:
            response = getattr(error, "response", {})
            code = str(response.get("Error", {}).get("Code", ""))
            status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _S3_CONFLICT_CODES or status in ("412", "409"):
                return False
            raise
        return True

    def replace_if(self, path: str, data: bytes, token: object) -> bool:
        if token is None:
            return self._put(path, data, IfNoneMatch="*")
        return self._put(path, data, IfMatch=str(token))

    def write_if_absent(self, path: str, data: bytes) -> bool:
        return self._put(path, data, IfNoneMatch="*")

    def write(self, path: str, data: bytes) -> None:
        self._put(path, data)


_REMOTE_STORES = {"gs": _GcsStore, "s3": _S3Store}
# scheme -> (the pipeline options its client was built from, the store). Building a client costs
# far more than a request (boto3 loads its service model), and history walks read one manifest
# per version; a client is rebuilt only when FileSystems.set_options gave new options.
_CACHED: dict[str, tuple[object, object]] = {}
_CACHE_LOCK = threading.Lock()


def _store(output_dir: str):
    scheme = output_dir.split("://", 1)[0].lower() if "://" in output_dir else None
    if scheme is None:
        return _LocalStore(output_dir)
    if scheme in _REMOTE_STORES:
        filesystem = FileSystems.get_filesystem(output_dir)
        # The options Beam's filesystem was built with (S3 keeps them as _options, GCS as _pipeline_options).
        options = getattr(filesystem, "_options", getattr(filesystem, "_pipeline_options", None))
        with _CACHE_LOCK:
            cached = _CACHED.get(scheme)
            if cached is None or cached[0] is not options or options is None:
                cached = _CACHED[scheme] = (options, _REMOTE_STORES[scheme](filesystem))
        return cached[1]
    raise JobError(
        f"cannot commit a dataset version into {output_dir}: a commit must replace dataset_info.json only "
        f"if no one else did meanwhile, and {scheme}:// offers no conditional write this job can use "
        "(local disk, gs:// and s3:// do); nothing was committed"
    )


# --- Reading and committing ------------------------------------------------------------------


def create_if_absent(path: str, data: bytes) -> bool:
    """Creates the object ``path`` (gs:// or s3://) holding ``data`` only if no object has that
    name, in one conditional request; False when one had. Two callers at once: exactly one True.
    Other schemes raise JobError (local disk has O_EXCL for this)."""
    scheme = path.split("://", 1)[0].lower() if "://" in path else None
    if scheme not in _REMOTE_STORES:
        raise JobError(f"{path}: a conditional create is only offered here for gs:// and s3://")
    return _store(path).write_if_absent(path, data)


def _parse(path: str, data: bytes) -> dict:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise JobError(
            f"{path} is not valid JSON ({error}); it is not a manifest this job wrote (commits replace it "
            "whole): if it was edited or damaged by hand, copy the newest versions/NNNNNNNN.json over it, "
            "or move it away"
        ) from None
    if not isinstance(manifest, dict):
        raise JobError(f"{path} holds a JSON {type(manifest).__name__}, not a manifest")
    return manifest


def read_current(output_dir: str) -> Current:
    """The root manifest of ``output_dir`` and the token a commit over it must present."""
    store = _store(output_dir)  # First: an unsupported scheme is refused before Beam resolves it.
    path = _join(output_dir, DATASET_INFO)
    data, token = store.read(path)
    return Current(manifest=None if data is None else _parse(path, data), data=data, token=token)


def _describe(current: Current) -> str:
    if current.manifest is None:
        return "there is no dataset_info.json now (it was removed)"
    change = current.manifest.get("change") or {}
    when = current.manifest.get("committed_at")
    return f"version {current.version} is current now" + (f" ({change.get('kind')}, committed {when})" if when else "")


def _highest_kept_version(output_dir: str) -> int:
    """The highest version in versions/ (0 if none): a root removed by hand must not make the next
    commit reuse a number whose history file is still there."""
    from beam_jobs.storage import list_folder  # pylint: disable=import-outside-toplevel

    try:
        names = [meta.path.rsplit("/", 1)[-1] for meta in list_folder(_join(output_dir, VERSIONS_DIR))]
    except Exception:  # pylint: disable=broad-except  # No versions/ folder: no history.
        return 0
    return max((int(m[1]) for m in map(_VERSION_FILE.match, names) if m), default=0)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then take their course.

    A commit is a few small writes. An interrupt that landed inside it (the job's own process
    converts and commits there with --direct_running_mode in_memory, and so does a rollback)
    raised KeyboardInterrupt between the root's write and its history copy: the caller heard
    "interrupted" of a version that was committed, and the copy's temp file stayed behind.
    Held, the interrupt lands just after the commit, which is then whole. Only the main thread
    sets handlers; a worker's bundle thread changes nothing (its process is ended by the
    runner, and a SIGKILL is never held: the kill tests cover those).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous: dict[signal.Signals, Callable | int] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is None or handler is signal.SIG_IGN:  # set outside Python, or ignored: left so
            continue
        previous[signum] = handler
        signal.signal(signum, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)


def commit_version(output_dir: str, manifest: dict, *, expected: Current, change: dict) -> dict:
    """Commits ``manifest`` as the version after ``expected``, or raises CommitConflictError.

    Sets version / parent_version / committed_at / change, then:

    1. makes sure versions/<parent>.json holds the parent's bytes (written if missing: a
       committer killed right after its root write left none);
    2. replaces OUT/dataset_info.json only if it is still ``expected`` (see the module docstring);
    3. writes versions/<new>.json, a copy (a kill before it is repaired by step 1 of the next
       commit; history readers take the current version from the root).

    A store may retry a conditional upload whose first attempt did land (a lost response): its
    retry then fails the precondition against our own write. So a failed precondition is a
    conflict only when the root does not hold exactly our bytes.
    Returns the committed manifest.
    """
    if not isinstance(change, dict) or not isinstance(change.get("kind"), str):
        raise ValueError(f"change must be a dict with a 'kind' (got {change!r})")
    store = _store(output_dir)
    root = _join(output_dir, DATASET_INFO)
    parent = expected.version
    with _interrupts_held(), store.guard():
        # Above every number the history holds, not just the parent's + 1: a root restored by hand
        # from versions/ (or removed) must never make a commit reuse a number whose history file,
        # and a trainer pinned to it, exist already; nor may a file of the user's there be replaced.
        version = max(parent or 0, _highest_kept_version(output_dir)) + 1
        committed = {
            **{k: v for k, v in manifest.items() if k not in VERSION_KEYS},
            "version": version,
            "parent_version": parent,
            "committed_at": utc_timestamp(),
            "change": dict(change),
        }
        data = manifest_bytes(committed)
        if parent is not None and expected.data is not None:
            store.write_if_absent(_join(output_dir, version_file(parent)), expected.data)
        if not store.replace_if(root, data, expected.token):
            now = read_current(output_dir)
            if now.data != data:
                raise CommitConflictError(
                    f"{root} changed after this commit read it: {_describe(now)}, so version {version} "
                    f"(over version {parent}) was not committed; read the current version and try again"
                )
        store.write(_join(output_dir, version_file(version)), data)
    return committed

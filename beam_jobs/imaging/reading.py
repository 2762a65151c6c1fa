"""Reading an input's bytes and state, each with a timeout, ahead of its decode.

Beam's filesystems take no timeout, and a thread blocked in open() or read() (a FIFO without a
writer, a hung NFS or FUSE mount) cannot be interrupted. So reads run on daemon threads: a read
that times out is abandoned there, and never keeps the worker from exiting (a
ThreadPoolExecutor's threads are joined at exit, and would). The job's shard converter reads a
few inputs ahead on a handful of such threads that live as long as it does, so that a read
costs no thread start and its latency (remote storage's above all) overlaps with decoding.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TypeVar

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import BadInputError, Reason, Stage
from beam_jobs.records import InputFile

__all__ = ["READ_TIMEOUT_S", "SourceReaders", "read_source", "source_digests", "source_state"]

_T = TypeVar("_T")
# The longest one source's open and read may take. Generous: a 64 MiB object over a slow link
# reads well within it, while a hung mount or a FIFO would block a read for ever.
READ_TIMEOUT_S = 300.0


def _timed_out(timeout_s: float) -> BadInputError:
    return BadInputError(
        Stage.READ,
        Reason.READ_TIMEOUT,
        f"no answer after {timeout_s:g} s (a FIFO, or a hung mount?); the read was abandoned",
    )


def source_state(input_file: InputFile, *, timeout_s: float | None = READ_TIMEOUT_S) -> list:
    """[size, modification time] of an input's source, followed by its mask's when it has one, with
    None for what cannot be read (or gives no answer within ``timeout_s``: a hung mount hangs a
    stat as it hangs a read).

    A hint, never a verdict: a staged shard is reused by --resume only if every one of its
    sources still has the state recorded when it was converted, and --append holds an input
    whose state is unchanged without reading it; when the state differs (a touch, a copy
    without -p, a checkout), --append compares ``source_digests`` instead, so that only other
    bytes are a change. The listing of a tree already knows both; an input list's entries cost
    one metadata request each (on object stores the time is that of the object's current
    generation or version).
    """
    state = _file_state(input_file.uri, input_file.size, input_file.mtime, timeout_s)
    annotations = input_file.annotations
    if annotations is not None and annotations.mask_uri is not None:
        state += _file_state(annotations.mask_uri, None, None, timeout_s)
    return state


def source_digests(input_file: InputFile, *, timeout_s: float | None = READ_TIMEOUT_S) -> list[str | None]:
    """[sha256 of the source's bytes], followed by its mask's when it has one, with None for what
    cannot be read: what --append compares, as a shard's sidecar records it, when a held input's
    size or time differ from those recorded. Reads each source whole (in chunks)."""
    uris = [input_file.uri]
    annotations = input_file.annotations
    if annotations is not None and annotations.mask_uri is not None:
        uris.append(annotations.mask_uri)
    return [_file_digest(uri, timeout_s) for uri in uris]


def _file_digest(uri: str, timeout_s: float | None) -> str | None:
    def digest() -> str:
        sha256 = hashlib.sha256()
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            while chunk := handle.read(1 << 20):
                sha256.update(chunk)
        return sha256.hexdigest()

    try:
        return _within(timeout_s, digest)
    except Exception:  # Missing or unreadable: not the bytes recorded, whatever they were.
        return None


def _file_state(uri: str, size: int | None, mtime: float | None, timeout_s: float | None) -> list:
    if size is not None and mtime is not None:
        return [size, mtime]
    try:
        meta = _within(timeout_s, partial(FileSystems.get_filesystem(uri).metadata, uri))
        return [meta.size_in_bytes, meta.last_updated_in_seconds]
    except Exception:  # Missing or unreadable: the read will dead-letter it; None records that.
        return [None, None]


def _limit_mb(max_file_bytes: int) -> str:
    """The --max_file_mb value a byte limit came from, as the user typed it (64, not 64.0)."""
    return f"{max_file_bytes / (1 << 20):g}"


def read_source(input_file: InputFile, max_file_bytes: int, *, timeout_s: float | None = READ_TIMEOUT_S) -> bytes:
    """Reads a source file, refusing it before (or while) reading when it is too large, and when
    it gives no answer within ``timeout_s`` (``read_timeout``)."""
    if input_file.size is not None and input_file.size > max_file_bytes:
        raise BadInputError(
            Stage.READ,
            Reason.FILE_TOO_LARGE,
            f"{input_file.size} bytes is over --max_file_mb={_limit_mb(max_file_bytes)} ({max_file_bytes} bytes)",
        )
    try:
        data = _within(timeout_s, partial(_read_bytes, input_file.uri, max_file_bytes))
    except BadInputError:
        raise
    except Exception as error:
        raise BadInputError(Stage.READ, Reason.READ_ERROR, f"{type(error).__name__}: {error}") from None
    if len(data) > max_file_bytes:
        raise BadInputError(
            Stage.READ,
            Reason.FILE_TOO_LARGE,
            f"more than {max_file_bytes} bytes, over --max_file_mb={_limit_mb(max_file_bytes)}",
        )
    if not data:
        raise BadInputError(Stage.READ, Reason.EMPTY_FILE, "the file is empty")
    return data


def _read_bytes(uri: str, max_file_bytes: int) -> bytes:
    # UNCOMPRESSED: Beam would otherwise gunzip a file that happens to end in .gz.
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read(max_file_bytes + 1)


def _within(timeout_s: float | None, call: Callable[[], _T]) -> _T:
    """``call()``, or BadInputError ``read_timeout`` when it has not returned after ``timeout_s``:
    the call runs on a daemon thread of its own, which a timed-out call leaves behind (for one
    call; SourceReaders keeps its threads for many)."""
    if timeout_s is None:
        return call()
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:  # handed to the caller's thread, as if raised there
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="read-source-timed", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise _timed_out(timeout_s)
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


class SourceReaders:
    """A few daemon threads that read sources for one converter, each read with a timeout.

    ``read_ahead`` yields (input, bytes or the BadInputError its read raised) in order, keeping
    up to ``window`` reads queued or running. A read that has run for ``timeout_s`` becomes a
    read_timeout dead letter; its thread, blocked in the read, is abandoned and replaced.
    """

    def __init__(self, threads: int, *, timeout_s: float | None) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._timeout_s = timeout_s
        self._threads = threads
        for _ in range(threads):
            self._start_thread()

    def _start_thread(self) -> None:
        threading.Thread(target=self._serve, name="read-source", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            for call, future, started in job:  # a run of reads, one after another
                if not future.set_running_or_notify_cancel():
                    continue
                started.append(time.monotonic())
                try:
                    future.set_result(call())
                except BaseException as error:  # handed to the caller's thread, as if raised there
                    future.set_exception(error)

    def _submit_run(self, calls: Sequence[Callable]) -> list[tuple[concurrent.futures.Future, list]]:
        """Queues ``calls`` as one job, read in order by one thread: (future, start time) of each."""
        job: list[tuple[Callable, concurrent.futures.Future, list[float]]] = [
            (call, concurrent.futures.Future(), []) for call in calls
        ]
        self._jobs.put(job)
        return [(future, started) for _, future, started in job]

    def _result(self, future: concurrent.futures.Future, started: list[float]):
        if self._timeout_s is None:
            return future.result()
        while True:
            # Until the read starts, wait in steps; once it runs, until its own deadline.
            wait = 1.0 if not started else max(0.0, started[0] + self._timeout_s - time.monotonic())
            try:
                return future.result(timeout=wait)
            except concurrent.futures.TimeoutError:
                if started and time.monotonic() - started[0] >= self._timeout_s:
                    self._start_thread()  # the one blocked in this read is lost
                    raise _timed_out(self._timeout_s) from None

    def call(self, call: Callable[[], _T]) -> _T:
        """``call()`` on a reader thread, or BadInputError ``read_timeout`` after ``timeout_s``: one
        read at a time, without a thread started per read (as ``read_source``'s own timeout does)."""
        return self._result(*self._submit_run([call])[0])

    def read_ahead(self, items: Iterable, read: Callable, *, window: int, run: int = 1) -> Iterator:
        """Yields (item, ``read(item)`` or its BadInputError) in the order of ``items``, reading ahead
        of the caller, with ``window`` items (and up to ``run`` more) queued or running, in jobs of
        ``run`` consecutive items: one thread reads a job's items in turn, so that a local read,
        quicker than waking a thread, costs one hand-off per job rather than one per item. When a read times out, the
        reads queued behind it in its job (never started, and never to be by the blocked thread)
        are queued again, each a job of its own."""
        pending: collections.deque = collections.deque()  # [item, call, future, started], in order

        def take():
            item, call, future, started = pending.popleft()
            try:
                return item, self._result(future, started)
            except BadInputError as error:
                if error.reason == Reason.READ_TIMEOUT:
                    requeue_stranded()
                return item, error

        def requeue_stranded() -> None:
            for entry in pending:
                if entry[2].cancel():  # still queued: it would wait for ever behind the blocked read
                    entry[2], entry[3] = self._submit_run([entry[1]])[0]

        batch: list = []

        def submit() -> None:
            nonlocal batch
            calls = [partial(read, item) for item in batch]
            for item, call, (future, started) in zip(batch, calls, self._submit_run(calls), strict=True):
                pending.append([item, call, future, started])
            batch = []

        for item in items:
            batch.append(item)
            if len(batch) >= run:
                submit()
            while len(pending) >= window:
                yield take()
        if batch:
            submit()
        while pending:
            yield take()

    def close(self) -> None:
        """Asks the reader threads to end after the reads already queued: the converter's teardown."""
        for _ in range(self._threads):
            self._jobs.put(None)

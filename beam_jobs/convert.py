"""Converting one planned shard: read, decode, preprocess and encode each input, write atomically."""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TypeVar

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs.config import ImageConfig
from beam_jobs.decode import decode_image
from beam_jobs.errors import BadInputError, Reason, Stage, WorkerShutdownError
from beam_jobs.example import ExampleFields, encode_pixels, serialize_example, source_id_for
from beam_jobs.isolation import IsolatedRunner, needs_isolation
from beam_jobs.plan import ShardPlan
from beam_jobs.preprocess import normalize_mode, required_source_size, resize_image
from beam_jobs.records import DeadLetter, InputFile, ShardResult
from beam_jobs.storage import temp_name, write_atomically
from beam_jobs.tfrecord_framing import frame_record

__all__ = [
    "CONTENT_KEYS",
    "DEAD_LETTERS",
    "METRICS_NAMESPACE",
    "READ_TIMEOUT_S",
    "ConvertShardFn",
    "convert_image",
    "shard_fingerprint",
    "sidecar_name",
]

DEAD_LETTERS = "dead_letters"
CONTENT_KEYS = "content_keys"
METRICS_NAMESPACE = "images_to_tfrecords"
_LOG = logging.getLogger(__name__)
_DETAILS = logging.getLogger("beam_jobs.details")  # one line per shard: --log_level INFO shows them
_T = TypeVar("_T")
# The longest one source's open and read may take. Generous: a 64 MiB object over a slow link
# reads well within it, while a hung mount or a FIFO would block a read for ever.
READ_TIMEOUT_S = 300.0


def convert_image(data: bytes, input_file: InputFile, config: ImageConfig) -> tuple[bytes, list[str], str]:
    """The whole per-image transformation, pure: source bytes to serialized Example bytes.

    Returns (serialized example, events worth counting, sha256 of the source bytes). Raises
    BadInputError for unusable input.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    decoded = decode_image(
        data,
        max_pixels=config.max_pixels,
        draft_size_for=partial(required_source_size, target=config.size, resize_mode=config.resize_mode),
    )
    image = normalize_mode(decoded.image, channels=config.channels)
    image = resize_image(image, config.size, config.resize_mode)
    encoded = encode_pixels(image, encoding=config.encoding, jpeg_quality=config.jpeg_quality)
    example = serialize_example(
        ExampleFields(
            encoded=encoded,
            format=config.format_name,
            height=config.height,
            width=config.width,
            channels=config.channels,
            label=input_file.label_id,
            label_text=input_file.label,
            filename=input_file.filename,
            sha256=sha256,
            source_id=source_id_for(input_file.filename),
        )
    )
    return example, decoded.events, sha256


def shard_fingerprint(shard: ShardPlan, run_fingerprint: str) -> str:
    """Identifies what a shard must contain: the run's settings and the shard's inputs (names and
    labels; their contents are checked separately, see ``source_state``)."""
    listing = [[f.filename, f.uri, f.label, f.label_id] for f in shard.inputs]
    text = json.dumps([run_fingerprint, shard.split, shard.index, shard.num_shards, listing])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def source_state(input_file: InputFile, *, timeout_s: float | None = READ_TIMEOUT_S) -> list:
    """[size, modification time] of an input's source, or [None, None] if it cannot be read (or
    gives no answer within ``timeout_s``: a hung mount hangs a stat as it hangs a read).

    A staged shard is reused by --resume only if every one of its sources still has the state
    recorded when it was converted: a replaced or repaired file changes size or time, and its
    shard is converted again. The listing of a tree already knows both; an input list's entries
    cost one metadata request each (on object stores the time is that of the object's current
    generation or version).
    """
    if input_file.size is not None and input_file.mtime is not None:
        return [input_file.size, input_file.mtime]
    try:
        meta = _within(timeout_s, partial(FileSystems.get_filesystem(input_file.uri).metadata, input_file.uri))
        return [meta.size_in_bytes, meta.last_updated_in_seconds]
    except Exception:  # Missing or unreadable: the read will dead-letter it; None records that.
        return [None, None]


def sidecar_name(file_name: str) -> str:
    """The hidden record beside a shard in its run folder: the shard's sources with their state,
    its content keys and dead letters. --resume trusts a shard by it without redoing it, and
    --append reads it to know which inputs a version already holds, so it is kept after the commit.
    """
    return f".{file_name}.json"


def _limit_mb(max_file_bytes: int) -> str:
    """The --max_file_mb value a byte limit came from, as the user typed it (64, not 64.0)."""
    return f"{max_file_bytes / (1 << 20):g}"


def _read_source(input_file: InputFile, max_file_bytes: int, *, timeout_s: float | None = READ_TIMEOUT_S) -> bytes:
    """Reads a source file, refusing it before (or while) reading when it is too large, and when
    it gives no answer within ``timeout_s`` (``read_timeout``)."""
    if input_file.size is not None and input_file.size > max_file_bytes:
        raise BadInputError(
            Stage.READ, Reason.FILE_TOO_LARGE, f"{input_file.size} bytes is over --max_file_mb={_limit_mb(max_file_bytes)} ({max_file_bytes} bytes)"
        )
    try:
        data = _within(timeout_s, partial(_read_bytes, input_file.uri, max_file_bytes))
    except BadInputError:
        raise
    except Exception as error:
        raise BadInputError(Stage.READ, Reason.READ_ERROR, f"{type(error).__name__}: {error}") from None
    if len(data) > max_file_bytes:
        raise BadInputError(Stage.READ, Reason.FILE_TOO_LARGE,
                            f"more than {max_file_bytes} bytes, over --max_file_mb={_limit_mb(max_file_bytes)}")
    if not data:
        raise BadInputError(Stage.READ, Reason.EMPTY_FILE, "the file is empty")
    return data


def _read_bytes(uri: str, max_file_bytes: int) -> bytes:
    # UNCOMPRESSED: Beam would otherwise gunzip a file that happens to end in .gz.
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read(max_file_bytes + 1)


def _within(timeout_s: float | None, call: Callable[[], _T]) -> _T:
    """``call()``, or BadInputError ``read_timeout`` when it has not returned after ``timeout_s``.

    Beam's filesystems take no timeout, and a thread blocked in open() or read() (a FIFO without
    a writer, a hung NFS or FUSE mount) cannot be interrupted. So the call runs on its own daemon
    thread, which a timed-out read leaves behind: a daemon, so that it never keeps the worker from
    exiting (a ThreadPoolExecutor's threads are joined at exit, and would).
    """
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
        raise BadInputError(Stage.READ, Reason.READ_TIMEOUT,
                            f"no answer after {timeout_s:g} s (a FIFO, or a hung mount?); the read was abandoned")
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def _read_ahead(items: Iterable, read: Callable, *, pool: concurrent.futures.Executor, window: int) -> Iterator:
    """Yields (item, read(item) or the BadInputError it raised) in order, reading up to ``window``
    items ahead on ``pool`` so that remote storage latency overlaps with decoding."""

    def safe_read(item):
        try:
            return read(item)
        except BadInputError as error:
            return error

    pending: collections.deque = collections.deque()
    for item in items:
        pending.append((item, pool.submit(safe_read, item)))
        if len(pending) >= window:
            head, future = pending.popleft()
            yield head, future.result()
    while pending:
        head, future = pending.popleft()
        yield head, future.result()


class _HashingWriter:
    """Counts and hashes the bytes of a shard while they are written, so the manifest's size and
    sha256 cost no second read."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self._handle.write(data)
        self.sha256.update(data)
        self.bytes += len(data)


class ConvertShardFn(beam.DoFn):
    """Converts one ShardPlan into one complete shard file in the run's own folder.

    The shard is written under a unique temporary name and renamed to its final name in the run
    folder once it is complete; it is never renamed again: the commit is the manifest's write,
    which lists the run folder's files (see commit.py). A retried or duplicated bundle
    rewrites the same bytes, and the atomic rename leaves exactly one complete file. Unusable
    inputs go to the DEAD_LETTERS output.
    """

    def __init__(self, config: ImageConfig, output_dir: str, *, run_fingerprint: str = "", resume: bool = False,
                 read_threads: int = 4, run_id: str | None = None, read_timeout_s: float = READ_TIMEOUT_S,
                 preprocessing: dict | None = None) -> None:
        self._config = config
        # Recorded in each sidecar with the run's fingerprint, so that a --resume with other flags
        # can say which setting differs for the staged shards it cannot keep.
        self._preprocessing = preprocessing
        self._read_timeout_s = read_timeout_s  # for each source's open and read: see _within
        self._run_id = run_id  # written into each sidecar: what the launching process's watcher counts
        self._output_dir = output_dir
        self._run_fingerprint = run_fingerprint
        self._resume = resume
        self._read_threads = read_threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._isolated: IsolatedRunner | None = None
        self._tearing_down = False
        counter = partial(Metrics.counter, METRICS_NAMESPACE)
        self._images_read = counter("images_read")
        self._images_written = counter("images_written")
        self._images_failed = counter("images_failed")
        self._bytes_read = counter("bytes_read")
        self._bytes_written = counter("bytes_written")
        self._shards_written = counter("shards_written")
        self._shards_resumed = counter("shards_resumed")

    def setup(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self._read_threads, thread_name_prefix="read-source")
        self._isolated = IsolatedRunner(timeout_s=self._config.decode_timeout_s)

    def teardown(self) -> None:
        self._tearing_down = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._isolated is not None:
            self._isolated.close()

    def _sources(self, inputs: tuple[InputFile, ...], read: Callable) -> Iterator:
        """(input, bytes or BadInputError) in order: read ahead on threads only for remote storage,
        where latency dominates; local reads are faster without the thread hand-offs."""
        if inputs and "://" in inputs[0].uri:
            yield from _read_ahead(inputs, read, pool=self._pool, window=2 * self._read_threads)
            return
        for input_file in inputs:
            try:
                yield input_file, read(input_file)
            except BadInputError as error:
                yield input_file, error

    def _convert(self, data: bytes, input_file: InputFile) -> tuple[bytes, list[str], str]:
        if needs_isolation(data, self._config.isolation):
            Metrics.counter(METRICS_NAMESPACE, "isolated_decodes").inc()
            return self._isolated(convert_image, data, input_file, self._config)
        return convert_image(data, input_file, self._config)

    def process(self, shard: ShardPlan):
        # ShardPlan(split, index, num_shards, inputs) -> ShardResult, plus DeadLetter on DEAD_LETTERS
        # The shard's final name, in this run's own folder: no committed version lists that folder
        # until the commit, so a reader never sees the file before the whole dataset is done.
        staged_path = FileSystems.join(self._output_dir, shard.file_name)
        sidecar_path = FileSystems.join(self._output_dir, sidecar_name(shard.file_name))
        if self._tearing_down:
            raise WorkerShutdownError(f"the worker shut down before converting {shard.file_name}")
        fingerprint = shard_fingerprint(shard, self._run_fingerprint)
        # Before anything is read: a source that changes during the conversion then differs from
        # what the sidecar records, and a later --resume converts it again.
        sources = list(self._pool.map(partial(source_state, timeout_s=self._read_timeout_s), shard.inputs))
        if self._resume:
            done = _verified_sidecar(staged_path, sidecar_path, fingerprint, sources)
            if done is not None:
                self._shards_resumed.inc()
                self._mark_kept(sidecar_path, done)
                _DETAILS.info("kept %s: complete and verified from an earlier run", shard.file_name)
                yield from self._outputs(shard, done)
                return
        temp_path = FileSystems.join(self._output_dir, temp_name(shard.file_name))
        content_keys: list[tuple[str, str, str]] = []
        dead_letters: list[DeadLetter] = []
        num_examples = 0
        read = partial(_read_source, max_file_bytes=self._config.max_file_bytes, timeout_s=self._read_timeout_s)
        handle = FileSystems.create(temp_path, mime_type="application/octet-stream",
                                    compression_type=CompressionTypes.UNCOMPRESSED)
        try:
            writer = _HashingWriter(handle)
            for input_file, data in self._sources(shard.inputs, read):
                if self._tearing_down:
                    raise WorkerShutdownError(f"the worker shut down while converting {shard.file_name}")
                try:
                    if isinstance(data, BadInputError):
                        raise data
                    self._images_read.inc()
                    self._bytes_read.inc(len(data))
                    try:
                        record, events, sha256 = self._convert(data, input_file)
                    except (BadInputError, WorkerShutdownError):
                        raise
                    except Exception as error:  # One odd file must not fail the whole shard.
                        raise BadInputError(Stage.CONVERT, Reason.UNEXPECTED_ERROR,
                                            f"{type(error).__name__}: {error}") from error
                except BadInputError as error:
                    dead_letters.append(DeadLetter(input_file.uri, error.stage, error.reason, error.detail))
                    self._images_failed.inc()
                    Metrics.counter(METRICS_NAMESPACE, f"failed_{error.reason}").inc()
                    continue
                for event in events:
                    Metrics.counter(METRICS_NAMESPACE, f"event_{event}").inc()
                writer.write(frame_record(record))
                num_examples += 1
                content_keys.append((sha256, input_file.filename, input_file.label))
            handle.close()
        except BaseException:
            handle.close()
            try:
                FileSystems.delete([temp_path])
            except Exception:  # The original error (a full disk, say) is the one to report.
                _LOG.warning("could not remove the temporary file %s", temp_path)
            raise
        if self._tearing_down:
            # The runner is tearing this worker down under us (it died, or cancelled the work):
            # what was converted may be incomplete, so it is never staged.
            FileSystems.delete([temp_path])
            raise WorkerShutdownError(f"the worker shut down while converting {shard.file_name}")
        FileSystems.rename([temp_path], [staged_path])
        done = {
            "fingerprint": fingerprint,
            "sources": sources,
            # Which inputs this shard was made from (in plan order, as ``sources``): --append reads
            # it to convert only the inputs that the current version does not hold yet.
            "inputs": [input_file.uri for input_file in shard.inputs],
            # ... and what the plan made of each (its label), and the shard's split: an input
            # relabelled or moved to another split since is a changed input, never silently kept.
            "input_labels": [input_file.label for input_file in shard.inputs],
            "split": shard.split,
            "file": shard.file_name,
            "num_examples": num_examples,
            "bytes": writer.bytes,
            "sha256": writer.sha256.hexdigest(),
            "dead_letters": [[d.uri, d.stage, d.reason, d.detail] for d in dead_letters],
            "content_keys": content_keys,
        }
        if self._run_id is not None:
            done["run_id"] = self._run_id
        if self._run_fingerprint:
            done["run_fingerprint"] = self._run_fingerprint
        if self._preprocessing is not None:
            done["preprocessing"] = self._preprocessing
        write_atomically(sidecar_path, json.dumps(done, sort_keys=True).encode("utf-8"))
        self._images_written.inc(num_examples)
        self._bytes_written.inc(writer.bytes)
        self._shards_written.inc()
        _DETAILS.info(
            "wrote %s: %d examples, %.3g MiB, %d dead letters",
            shard.file_name, num_examples, writer.bytes / 2**20, len(dead_letters),
        )
        yield from self._outputs(shard, done)

    def _mark_kept(self, sidecar_path: str, done: dict) -> None:
        """Rewrites a kept shard's sidecar with this run's id, so that the watcher counts the shard
        now, and as kept rather than converted (see progress.py). Its verified fields are unchanged."""
        if self._run_id is None:
            return
        try:
            write_atomically(sidecar_path, json.dumps({**done, "run_id": self._run_id, "kept": True},
                                                      sort_keys=True).encode("utf-8"))
        except Exception:  # Only the progress display would miss this shard; the shard itself is good.
            _LOG.warning("could not mark %s as kept by this run", sidecar_path)

    @staticmethod
    def _outputs(shard: ShardPlan, done: dict):
        for uri, stage, reason, detail in done["dead_letters"]:
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, DeadLetter(uri, stage, reason, detail))
        for sha256, filename, label in done["content_keys"]:
            yield beam.pvalue.TaggedOutput(CONTENT_KEYS, (sha256, (filename, label)))
        # From the sidecar, so a shard kept by --resume (even one staged by an older version)
        # reports the same counts as a freshly converted one.
        classes = collections.Counter(label for _, _, label in done["content_keys"])
        reasons = collections.Counter(reason for _, _, reason, _ in done["dead_letters"])
        yield ShardResult(
            split=shard.split,
            index=shard.index,
            num_shards=shard.num_shards,
            file=shard.file_name,
            num_examples=done["num_examples"],
            bytes=done["bytes"],
            sha256=done["sha256"],
            class_counts=tuple(sorted(classes.items())),
            dead_letters_by_reason=tuple(sorted(reasons.items())),
        )


def _file_sha256(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _verified_sidecar(staged_path: str, sidecar_path: str, fingerprint: str, sources: list) -> dict | None:
    """The sidecar of a staged shard when the shard on disk is exactly what this run would write:
    the same settings and inputs, every source unchanged since, and the file intact."""
    try:
        if not (FileSystems.exists(staged_path) and FileSystems.exists(sidecar_path)):
            return None
        with FileSystems.open(sidecar_path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            done = json.loads(handle.read().decode("utf-8"))
        if done.get("fingerprint") != fingerprint or done.get("sources") != sources:
            return None
        if _file_sha256(staged_path) != (done["bytes"], done["sha256"]):
            return None
        return done
    except (OSError, ValueError, KeyError):
        return None

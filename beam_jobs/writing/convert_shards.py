"""Converting one planned shard: read, decode, preprocess and encode each input, write atomically."""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any, BinaryIO, Final, Literal

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError, Reason, Stage, WorkerShutdownError
from beam_jobs.imaging.isolation import IsolatedRunner, needs_isolation
from beam_jobs.imaging.reading import READ_TIMEOUT_S, SourceReaders, read_source, source_state
from beam_jobs.planning.rules import ShardPlan
from beam_jobs.records import DeadLetter, InputFile, ShardResult
from beam_jobs.storage import temp_name, write_atomically
from beam_jobs.third_party_warnings import warnings_to_debug_log
from beam_jobs.writing.example_conversion import ExampleClasses, convert_image
from beam_jobs.writing.run_folders import sidecar_name
from beam_jobs.writing.shard_progress import ShardProgressNote
from beam_jobs.writing.shard_sidecar import (
    ShardContents,
    shard_fingerprint,
    shard_result,
    sidecar_record,
    verified_sidecar,
)
from beam_jobs.writing.tfrecord_framing import frame_record

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

DEAD_LETTERS: Final = "dead_letters"
CONTENT_KEYS: Final = "content_keys"
# The tagged outputs' types, for Beam's type hints (a bare TaggedOutput would join the main output's).
DeadLetterOutput = TaggedOutput[Literal["dead_letters"], DeadLetter]
ContentKeyOutput = TaggedOutput[Literal["content_keys"], tuple[str, tuple[str, Any]]]
METRICS_NAMESPACE = "images_to_tfrecords"
_LOG = logging.getLogger(__name__)
_DETAILS = logging.getLogger("beam_jobs.details")  # one line per shard: --log_level INFO shows them
# Images converted at once by one worker (see ConvertShardFn._conversions). Two fill a second core
# when the other workers are idle or slow; more only add memory (each holds a decoded image).
CONVERT_THREADS = 2
# The most inputs, and about the most bytes of sources, one converter thread takes at once (see
# ConvertShardFn._conversions): 8 photos of 500x375 cost one hand-off instead of 8, and large
# sources still go one or two at a time, so that a worker holds a few chunks of them at most.
CONVERT_CHUNK = 8
CONVERT_CHUNK_BYTES = 4 << 20
# Consecutive sources one reader thread reads per job (SourceReaders.read_ahead): a local read of a
# photo takes less time than waking a thread for it.
READ_RUN = 4


class _ChunkOutcome:
    """One input's conversion within its chunk's future, with a future's result() and cancel():
    result() returns the input's converted example or raises the error its conversion raised."""

    __slots__ = ("_future", "_index")

    def __init__(self, future: concurrent.futures.Future, index: int) -> None:
        self._future = future
        self._index = index

    def result(self) -> Any:
        outcome = self._future.result()[self._index]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def cancel(self) -> bool:
        return self._future.cancel()


class _HashingWriter:
    """Counts and hashes the bytes of a shard while they are written, so the manifest's size and
    sha256 cost no second read."""

    def __init__(self, handle: BinaryIO) -> None:
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

    def __init__(
        self,
        config: ImageConfig,
        output_dir: str,
        *,
        run_fingerprint: str = "",
        resume: bool = False,
        read_threads: int = 4,
        convert_threads: int = CONVERT_THREADS,
        run_id: str | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
        preprocessing: dict | None = None,
        made_for: str = "",
    ) -> None:
        self._config = config
        # What the run's shards are for, when not every input: "append_to:N" for an append to
        # version N (it converts only what N lacks). --resume continues a run folder only for the
        # same purpose: an overwrite's folder holds other shards than an append's.
        self._made_for = made_for
        # Recorded in each sidecar with the run's fingerprint, so that a --resume with other flags
        # can say which setting differs for the staged shards it cannot keep.
        self._preprocessing = preprocessing
        self._read_timeout_s = read_timeout_s  # for each source's open and read: see _within
        self._run_id = run_id  # written into each sidecar: what the launching process's watcher counts
        self._output_dir = output_dir
        self._run_fingerprint = run_fingerprint
        self._resume = resume
        self._read_threads = read_threads
        self._convert_threads = convert_threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # for sources' metadata
        self._readers: SourceReaders | None = None
        self._converters: concurrent.futures.ThreadPoolExecutor | None = None
        self._isolated: IsolatedRunner | None = None
        # One isolated decode at a time: its child takes one call at a time, and a call queued
        # behind another's would be charged the other's time against its own decode timeout.
        self._isolated_lock = threading.Lock()
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
        """Starts the worker's threads and its isolated decoder once, to serve every shard it converts."""
        warnings_to_debug_log()  # On every runner's workers: libraries' warnings are not the console's.
        self._pool = concurrent.futures.ThreadPoolExecutor(self._read_threads, thread_name_prefix="source-state")
        self._readers = SourceReaders(self._read_threads, timeout_s=self._read_timeout_s)
        self._converters = concurrent.futures.ThreadPoolExecutor(self._convert_threads, thread_name_prefix="convert")
        self._isolated = IsolatedRunner(timeout_s=self._config.decode_timeout_s)

    def teardown(self) -> None:
        """Stops the threads and the decoder; a shard still converting then fails rather than staging part of itself."""
        self._tearing_down = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._readers is not None:
            self._readers.close()
        if self._converters is not None:
            self._converters.shutdown(wait=False, cancel_futures=True)
        if self._isolated is not None:
            self._isolated.close()

    def _sources(self, inputs: tuple[InputFile, ...]):
        """(input, bytes or BadInputError) in order, read a few ahead on the converter's reader
        threads, each read with the converter's read timeout (reading.py)."""
        read = partial(_read_with_mask, max_file_bytes=self._config.max_file_bytes)
        assert self._readers is not None, "setup() makes the threads"
        return self._readers.read_ahead(inputs, read, window=2 * self._read_threads, run=READ_RUN)

    def _source_states(self, inputs: tuple[InputFile, ...]) -> list:
        """source_state of each input: from the listing where it knows size and time (a tree's
        does), else one metadata request each, on threads (an input list's entries)."""
        state_of = partial(source_state, timeout_s=self._read_timeout_s)
        if all(f.size is not None and f.mtime is not None and f.annotations is None for f in inputs):
            return [state_of(f) for f in inputs]  # no I/O: not worth a thread hand-off each
        assert self._pool is not None, "setup() makes the threads"
        return list(self._pool.map(state_of, inputs))

    def _convert(
        self, data: bytes, input_file: InputFile, *, isolated: bool, mask: bytes | None = None
    ) -> tuple[bytes, list[str], str, ExampleClasses | None]:
        """convert_image, in the isolated child if ``isolated``. Runs on a converter thread."""
        if isolated:
            assert self._isolated is not None, "setup() makes the isolated runner"
            with self._isolated_lock:
                return self._isolated(convert_image, data, input_file, self._config, mask)
        return convert_image(data, input_file, self._config, mask)

    def _convert_chunk(self, chunk: list[tuple[InputFile, bytes, bytes | None, bool]]) -> list:
        """_convert of each of a chunk's read inputs, in order: its result, or the Exception it
        raised (one odd file is that file's dead letter, never its chunk's). Runs on a converter thread."""
        outcomes: list = []
        for input_file, data, mask, isolated in chunk:
            try:
                outcomes.append(self._convert(data, input_file, isolated=isolated, mask=mask))
            except Exception as error:  # handed back to the writing thread, as if raised there
                outcomes.append(error)
        return outcomes

    def _conversions(self, inputs: tuple[InputFile, ...], mask_digests: dict[str, str] | None = None):
        """(input, bytes or BadInputError, whether it is decoded in isolation, its _ChunkOutcome
        or None) in plan order.

        Each source is read ahead on the reader threads, then converted on the converter threads,
        a few chunks ahead of the one being written. The codecs (libjpeg-turbo, OpenCV, Pillow's
        decode, resize and encode) and hashing release the GIL, so one worker converts on several
        cores at once: a worker that is given more of the work than the others, or is slowed by
        them, still finishes at about the same time, instead of leaving a core idle at the end of
        the job. A converter takes a chunk of consecutive inputs (up to CONVERT_CHUNK of them, or
        CONVERT_CHUNK_BYTES of sources) rather than one: handing each image to a thread and its
        result back cost about 0.2 ms of CPU per image, an eighth of a 224 px conversion
        (docs/benchmarks.md). Results are taken in plan order, so the shard's bytes do not depend
        on the threads.
        """
        pending: collections.deque = collections.deque()  # (chunk, its future), oldest first
        converters = self._converters
        assert converters is not None, "setup() makes the threads"
        chunk: list[tuple[InputFile, bytes | BadInputError, bytes | None, bool]] = []
        chunk_bytes = 0

        def submit() -> None:
            nonlocal chunk, chunk_bytes
            readable = [
                (input_file, data, mask, isolated)
                for input_file, data, mask, isolated in chunk
                if not isinstance(data, BadInputError)
            ]
            future = converters.submit(self._convert_chunk, readable) if readable else None
            pending.append((chunk, future))
            chunk, chunk_bytes = [], 0

        def written_first() -> Iterator:
            entries, future = pending.popleft()
            index = 0
            for input_file, data, _, isolated in entries:
                if isinstance(data, BadInputError):
                    yield input_file, data, isolated, None
                else:
                    assert future is not None, "a chunk with a read input is converted"
                    yield input_file, data, isolated, _ChunkOutcome(future, index)
                    index += 1

        try:
            for input_file, read in self._sources(inputs):
                data, mask = read if isinstance(read, tuple) else (read, None)
                if mask is not None and mask_digests is not None:  # the sidecar records it (input_sha256)
                    mask_digests[input_file.filename] = hashlib.sha256(mask).hexdigest()
                isolated = not isinstance(data, BadInputError) and needs_isolation(data, self._config.isolation)
                chunk.append((input_file, data, mask, isolated))
                chunk_bytes += 0 if isinstance(data, BadInputError) else len(data)
                if len(chunk) >= CONVERT_CHUNK or chunk_bytes >= CONVERT_CHUNK_BYTES:
                    submit()
                    if len(pending) > self._convert_threads:
                        yield from written_first()
            if chunk:
                submit()
            while pending:
                yield from written_first()
        finally:  # the shard failed, or the worker is shutting down: nothing more to convert
            for _, future in pending:
                if future is not None:
                    future.cancel()

    def process(self, shard: ShardPlan) -> Iterator[ShardResult | DeadLetterOutput | ContentKeyOutput]:
        """Converts one shard into its file and sidecar (or, under --resume, keeps the one an earlier
        run staged once it is verified), then yields its ShardResult, dead letters and content keys."""
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
        sources = self._source_states(shard.inputs)
        done = self._kept_shard(shard, staged_path, sidecar_path, fingerprint, sources) if self._resume else None
        if done is None:
            done = self._converted_shard(shard, staged_path, sidecar_path, fingerprint, sources)
        yield from self._outputs(shard, done)

    def _kept_shard(
        self, shard: ShardPlan, staged_path: str, sidecar_path: str, fingerprint: str, sources: list
    ) -> dict | None:
        """--resume: the sidecar of the shard an earlier run staged, when it is verified and so kept
        (marked as kept by this run), else None."""
        done = verified_sidecar(staged_path, sidecar_path, fingerprint, sources)
        if done is not None:
            self._shards_resumed.inc()
            self._mark_kept(sidecar_path, done)
            _DETAILS.info("kept %s: complete and verified from an earlier run", shard.file_name)
        return done

    def _converted_shard(
        self, shard: ShardPlan, staged_path: str, sidecar_path: str, fingerprint: str, sources: list
    ) -> dict:
        """Converts the shard under a temporary name, renames it to ``staged_path`` once complete,
        then writes its sidecar; returns the sidecar."""
        temp_path = FileSystems.join(self._output_dir, temp_name(shard.file_name))
        note = None if self._run_id is None else ShardProgressNote(self._output_dir, self._run_id, shard.file_name)
        contents, writer = self._write_temp_shard(shard, temp_path, note)
        if self._tearing_down:
            # The runner is tearing this worker down under us (it died, or cancelled the work):
            # what was converted may be incomplete, so it is never staged.
            FileSystems.delete([temp_path])
            raise WorkerShutdownError(f"the worker shut down while converting {shard.file_name}")
        FileSystems.rename([temp_path], [staged_path])
        done = sidecar_record(
            shard,
            contents,
            size=writer.bytes,
            sha256=writer.sha256.hexdigest(),
            fingerprint=fingerprint,
            sources=sources,
            run_facts=self._run_facts(),
        )
        write_atomically(sidecar_path, json.dumps(done, sort_keys=True).encode("utf-8"))
        if note is not None:  # the sidecar counts the shard's images now
            note.remove()
        self._images_written.inc(contents.num_examples)
        self._bytes_written.inc(writer.bytes)
        self._shards_written.inc()
        _DETAILS.info(
            "wrote %s: %d examples, %.3g MiB, %d dead letters",
            shard.file_name,
            contents.num_examples,
            writer.bytes / 2**20,
            len(contents.dead_letters),
        )
        return done

    def _write_temp_shard(
        self, shard: ShardPlan, temp_path: str, note: ShardProgressNote | None
    ) -> tuple[ShardContents, _HashingWriter]:
        """Writes the shard's examples to ``temp_path`` in plan order; returns what they held and
        the file's size and hash. On any failure the temporary file is removed (and the note)."""
        contents = ShardContents()
        handle = FileSystems.create(
            temp_path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )
        try:
            writer = _HashingWriter(handle)
            for input_file, data, isolated, conversion in self._conversions(shard.inputs, contents.mask_digests):
                if self._tearing_down:
                    raise WorkerShutdownError(f"the worker shut down while converting {shard.file_name}")
                if note is not None:  # the inputs done before this one, for the launcher's display
                    note.count(contents.num_done)
                converted = self._conversion_result(input_file, data, isolated, conversion, contents)
                if converted is None:
                    continue
                record, events, sha256, classes = converted
                for event in events:
                    Metrics.counter(METRICS_NAMESPACE, f"event_{event}").inc()
                writer.write(frame_record(record))
                contents.add_example(input_file, sha256, classes)
            handle.close()
        except BaseException:
            handle.close()
            if note is not None:
                note.remove()
            try:
                FileSystems.delete([temp_path])
            except Exception:  # The original error (a full disk, say) is the one to report.
                _LOG.warning("could not remove the temporary file %s", temp_path)
            raise
        return contents, writer

    def _conversion_result(
        self,
        input_file: InputFile,
        data: bytes | BadInputError,
        isolated: bool,
        conversion: _ChunkOutcome | None,
        contents: ShardContents,
    ) -> tuple[bytes, list[str], str, ExampleClasses | None] | None:
        """The input's converted example, or None when it is unusable: then its dead letter is in
        ``contents``, and counted. Any error of one odd file is its dead letter, never the shard's."""
        try:
            if isinstance(data, BadInputError):
                raise data
            self._images_read.inc()
            self._bytes_read.inc(len(data))
            if isolated:
                # Here, not on the converter thread: Beam's metrics belong to this thread.
                Metrics.counter(METRICS_NAMESPACE, "isolated_decodes").inc()
            try:
                assert conversion is not None, "a read input is converted"
                converted = conversion.result()
                contents.digests[input_file.filename] = converted[2]
            except (BadInputError, WorkerShutdownError):
                raise
            except Exception as error:  # One odd file must not fail the whole shard.
                raise BadInputError(
                    Stage.CONVERT, Reason.UNEXPECTED_ERROR, f"{type(error).__name__}: {error}"
                ) from error
        except BadInputError as error:
            contents.add_dead_letter(input_file, error, data)
            self._images_failed.inc()
            Metrics.counter(METRICS_NAMESPACE, f"failed_{error.reason}").inc()
            return None
        return converted

    def _run_facts(self) -> dict:
        """What each sidecar records of the run, where the run has it."""
        facts: dict = {}
        if self._run_id is not None:
            facts["run_id"] = self._run_id
        if self._run_fingerprint:
            facts["run_fingerprint"] = self._run_fingerprint
        if self._made_for:
            facts["made_for"] = self._made_for
        if self._preprocessing is not None:
            facts["preprocessing"] = self._preprocessing
        return facts

    def _mark_kept(self, sidecar_path: str, done: dict) -> None:
        """Rewrites a kept shard's sidecar with this run's id, so that the watcher counts the shard
        now, and as kept rather than converted (see progress.py). Its verified fields are unchanged."""
        if self._run_id is None:
            return
        try:
            write_atomically(
                sidecar_path, json.dumps({**done, "run_id": self._run_id, "kept": True}, sort_keys=True).encode("utf-8")
            )
        except Exception:  # Only the progress display would miss this shard; the shard itself is good.
            _LOG.warning("could not mark %s as kept by this run", sidecar_path)

    @staticmethod
    def _outputs(shard: ShardPlan, done: dict) -> Iterator[ShardResult | DeadLetterOutput | ContentKeyOutput]:
        """The shard's dead letters and content keys, then its ShardResult: all from its sidecar."""
        for uri, stage, reason, detail in done["dead_letters"]:
            yield DeadLetterOutput(DEAD_LETTERS, DeadLetter(uri, stage, reason, detail))
        for sha256, filename, label in done["content_keys"]:
            yield ContentKeyOutput(CONTENT_KEYS, (sha256, (filename, label)))
        yield shard_result(shard, done)


def _read_with_mask(input_file: InputFile, max_file_bytes: int) -> bytes | tuple[bytes, bytes]:
    """The input's bytes, and its semantic mask's when it has one, read on one reader thread: the
    two are one input, refused together (a mask that cannot be read names the mask)."""
    data = read_source(input_file, max_file_bytes, timeout_s=None)
    annotations = input_file.annotations
    if annotations is None or annotations.mask_uri is None:
        return data
    try:
        mask = read_source(replace(input_file, uri=annotations.mask_uri, size=None), max_file_bytes, timeout_s=None)
    except BadInputError as error:
        raise BadInputError(error.stage, error.reason, f"its mask {annotations.mask_uri}: {error.detail}") from None
    return data, mask

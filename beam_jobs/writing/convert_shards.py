"""Converting one planned shard: read, decode, preprocess and encode each input, write atomically."""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import BinaryIO

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError, Reason, Stage, WorkerShutdownError
from beam_jobs.imaging.annotate import BAD_ANNOTATION, StoredObjects, stored_objects
from beam_jobs.imaging.decode import DecodedImage, DecodedPixels, decode_image, decode_rgb_pixels
from beam_jobs.imaging.example import ExampleFields, encode_array, encode_pixels, serialize_example, source_id_for
from beam_jobs.imaging.geometry import Placement, place
from beam_jobs.imaging.isolation import IsolatedRunner, needs_isolation
from beam_jobs.imaging.masks import encode_mask_png, semantic_mask
from beam_jobs.imaging.preprocess import normalize_mode, required_source_size, resize_image_by, resize_pixels_by
from beam_jobs.imaging.reading import READ_TIMEOUT_S, SourceReaders, read_source, source_state
from beam_jobs.imaging.resample import ARRAY_METHODS
from beam_jobs.planning.rules import ShardPlan
from beam_jobs.records import DeadLetter, InputFile, ShardResult, annotation_digest, content_label
from beam_jobs.storage import temp_name, write_atomically
from beam_jobs.third_party_warnings import warnings_to_debug_log
from beam_jobs.writing.run_folders import sidecar_name
from beam_jobs.writing.shard_progress import ShardProgressNote
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

DEAD_LETTERS = "dead_letters"
CONTENT_KEYS = "content_keys"
METRICS_NAMESPACE = "images_to_tfrecords"
_LOG = logging.getLogger(__name__)
_DETAILS = logging.getLogger("beam_jobs.details")  # one line per shard: --log_level INFO shows them
# Images converted at once by one worker (see ConvertShardFn._conversions). Two fill a second core
# when the other workers are idle or slow; more only add memory (each holds a decoded image).
CONVERT_THREADS = 2


def convert_image(
    data: bytes, input_file: InputFile, config: ImageConfig, mask: bytes | None = None
) -> tuple[bytes, list[str], str, ExampleClasses | None]:
    """The whole per-image transformation, pure: source bytes (and its semantic mask's, when it
    has one) to serialized Example bytes.

    Returns (serialized example, events worth counting, sha256 of the source bytes, and for an
    annotated input the classes and objects the example holds). Raises BadInputError for
    unusable input.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    draft_size_for = partial(
        required_source_size, target=config.size, resize_mode=config.resize_mode, max_side=config.max_side
    )
    if config.resample in ARRAY_METHODS and config.channels == 3:
        # The fast path: numpy arrays from decode to encode (decode.py, resample.py).
        fast = decode_rgb_pixels(
            data,
            max_pixels=config.max_pixels,
            draft_size_for=draft_size_for,
            normalize=partial(normalize_mode, channels=3),
        )
        decoded_size = (fast.pixels.shape[1], fast.pixels.shape[0])
        placement = place(decoded_size, config.size, config.resize_mode, whole_pixels=True, max_side=config.max_side)
        decoded: DecodedImage | DecodedPixels = fast
        if _stored_as_is(decoded, decoded_size, placement, config):
            encoded = data
        else:
            pixels = resize_pixels_by(fast.pixels, placement, config.resample)
            encoded = encode_array(pixels, encoding=config.encoding, jpeg_quality=config.jpeg_quality)
    else:
        decoded_image = decode_image(data, max_pixels=config.max_pixels, draft_size_for=draft_size_for)
        image = normalize_mode(decoded_image.image, channels=config.channels)
        decoded_size = image.size
        placement = place(decoded_size, config.size, config.resize_mode, max_side=config.max_side)
        decoded = decoded_image
        if _stored_as_is(decoded, decoded_size, placement, config):
            encoded = data
        else:
            image = resize_image_by(image, placement, config.resample)
            encoded = encode_pixels(image, encoding=config.encoding, jpeg_quality=config.jpeg_quality)
    events = list(decoded.events)
    width, height = placement.output_size
    fields = ExampleFields(
        encoded=encoded,
        format=config.format_name,
        height=height,
        width=width,
        channels=config.channels,
        label=input_file.label_id,
        label_text=input_file.label or "",
        filename=input_file.filename,
        sha256=sha256,
        source_id=source_id_for(input_file.filename),
    )
    classes = None
    if input_file.annotations is not None:
        objects = stored_objects(
            input_file.annotations,
            file_size=decoded.source_size,
            orientation=decoded.orientation,
            decoded_size=decoded_size,
            placement=placement,
            frame=config.annotation_frame,
        )
        events += ["object_cut_by_crop"] * objects.dropped
        ids = _image_classes(input_file, objects)
        fields = replace(fields, labels=tuple(ids), label_texts=tuple(ids.values()), objects=objects)
        mask_ids: tuple[int, ...] = ()
        if "mask" in input_file.annotations.kinds:
            placed = _semantic_mask(mask, input_file, decoded, decoded_size, placement, config.annotation_frame)
            mask_ids = tuple(int(i) for i in np.unique(placed))
            fields = replace(fields, segmentation_png=encode_mask_png(placed))
        classes = ExampleClasses(tuple(ids.values()), tuple(objects.label_texts), objects.dropped, mask_ids)
    else:
        assert input_file.label is not None, "a planned input has its label or its annotations"
    return serialize_example(fields), events, sha256, classes


def _semantic_mask(
    mask: bytes | None,
    input_file: InputFile,
    decoded: DecodedImage | DecodedPixels,
    decoded_size: tuple[int, int],
    placement: Placement,
    frame: str,
) -> np.ndarray:
    """The stored image's semantic mask (class ids, the stored image's size); an input of a
    dataset with masks that has none is refused (its example would be trained as all background)."""
    if mask is None:
        raise BadInputError(
            Stage.PREPROCESS, BAD_ANNOTATION, "no mask: the other inputs of this dataset have one (the mask column)"
        )
    return semantic_mask(
        mask,
        file_size=decoded.source_size,
        orientation=decoded.orientation,
        decoded_size=decoded_size,
        placement=placement,
        frame=frame,
    )


@dataclass(frozen=True)
class ExampleClasses:
    """What an annotated example holds, for the manifest's counts: its classes (image level),
    the class of each object it keeps, how many objects the crop cut away, and the ids its mask
    holds (a mask's ids are the user's own numbers, so the manifest records the ones seen)."""

    classes: tuple[str, ...]
    objects: tuple[str, ...]
    dropped: int
    mask_ids: tuple[int, ...] = ()  # the class ids its semantic mask holds


def _image_classes(input_file: InputFile, objects: StoredObjects) -> dict[int, str]:
    """The image-level classes of an annotated example, id -> name in id order: its label, its
    listed labels, and the class of each object the stored image still shows."""
    annotations = input_file.annotations
    assert annotations is not None
    ids = dict(zip(annotations.label_ids, annotations.labels, strict=True))
    ids.update(zip(objects.label_ids, objects.label_texts, strict=True))
    if input_file.label is not None:
        ids[input_file.label_id] = input_file.label
    return dict(sorted(ids.items()))


def _stored_as_is(
    decoded: DecodedImage | DecodedPixels, decoded_size: tuple[int, int], placement: Placement, config: ImageConfig
) -> bool:
    """True when the keep mode may store the source file's own bytes: a JPEG, to be stored as JPEG,
    already upright, in the colour mode asked for, decoded and kept at full size. Anything else is
    re-encoded from the pixels (a reader would otherwise see it sideways, or in CMYK)."""
    return (
        config.keeps_size
        and config.encoding == "jpeg"
        and decoded.source_format == "JPEG"
        and decoded.orientation == 1
        and decoded.source_mode == ("RGB" if config.channels == 3 else "L")
        and decoded_size == decoded.source_size
        and placement.is_identity
    )


def shard_fingerprint(shard: ShardPlan, run_fingerprint: str) -> str:
    """Identifies what a shard must contain: the run's settings and the shard's inputs (names and
    labels; their contents are checked separately, see ``source_state``)."""
    listing = [[f.filename, f.uri, f.label, f.label_id] for f in shard.inputs]
    if any(f.annotations is not None for f in shard.inputs):
        # Only for annotated inputs, so that the shards of earlier releases keep their fingerprints.
        listing.append([repr(f.annotations) for f in shard.inputs])
    text = json.dumps([run_fingerprint, shard.split, shard.index, shard.num_shards, listing])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
        return self._readers.read_ahead(inputs, read, window=2 * self._read_threads)

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

    def _conversions(self, inputs: tuple[InputFile, ...], mask_digests: dict[str, str] | None = None):
        """(input, bytes or BadInputError, whether it is decoded in isolation, future of its
        _convert or None) in plan order.

        Each source is read ahead on the reader threads, then converted on the converter threads,
        a few ahead of the one being written. The codecs (libjpeg-turbo, OpenCV, Pillow's decode,
        resize and encode) and hashing release the GIL, so one worker converts on several cores at
        once: a worker that is given more of the work than the others, or is slowed by them, still
        finishes at about the same time, instead of leaving a core idle at the end of the job.
        Results are taken in plan order, so the shard's bytes do not depend on the threads.
        """
        pending: collections.deque = collections.deque()
        window = 2 * self._convert_threads
        converters = self._converters
        assert converters is not None, "setup() makes the threads"
        try:
            for input_file, read in self._sources(inputs):
                data, mask = read if isinstance(read, tuple) else (read, None)
                if mask is not None and mask_digests is not None:  # the sidecar records it (input_sha256)
                    mask_digests[input_file.filename] = hashlib.sha256(mask).hexdigest()
                if isinstance(data, BadInputError):
                    isolated, conversion = False, None
                else:
                    isolated = needs_isolation(data, self._config.isolation)
                    conversion = converters.submit(self._convert, data, input_file, isolated=isolated, mask=mask)
                pending.append((input_file, data, isolated, conversion))
                if len(pending) > window:
                    yield pending.popleft()
            while pending:
                yield pending.popleft()
        finally:  # the shard failed, or the worker is shutting down: nothing more to convert
            for _, _, _, conversion in pending:
                if conversion is not None:
                    conversion.cancel()

    def process(self, shard: ShardPlan) -> Iterator[ShardResult | beam.pvalue.TaggedOutput]:
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
        # sha256 of each input's source bytes (and its mask's) by filename, dead letters read included
        digests: dict[str, str] = {}
        mask_digests: dict[str, str] = {}
        # Annotated examples: [image-level classes, object classes, objects cut by the crop] each
        annotated: list[list] = []
        dead_letters: list[DeadLetter] = []
        num_examples = 0
        note = None if self._run_id is None else ShardProgressNote(self._output_dir, self._run_id, shard.file_name)
        handle = FileSystems.create(
            temp_path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )
        try:
            writer = _HashingWriter(handle)
            for input_file, data, isolated, conversion in self._conversions(shard.inputs, mask_digests):
                if self._tearing_down:
                    raise WorkerShutdownError(f"the worker shut down while converting {shard.file_name}")
                if note is not None:  # the inputs done before this one, for the launcher's display
                    note.count(num_examples + len(dead_letters))
                try:
                    if isinstance(data, BadInputError):
                        raise data
                    self._images_read.inc()
                    self._bytes_read.inc(len(data))
                    if isolated:
                        # Here, not on the converter thread: Beam's metrics belong to this thread.
                        Metrics.counter(METRICS_NAMESPACE, "isolated_decodes").inc()
                    try:
                        record, events, sha256, classes = conversion.result()
                        digests[input_file.filename] = sha256
                    except (BadInputError, WorkerShutdownError):
                        raise
                    except Exception as error:  # One odd file must not fail the whole shard.
                        raise BadInputError(
                            Stage.CONVERT, Reason.UNEXPECTED_ERROR, f"{type(error).__name__}: {error}"
                        ) from error
                except BadInputError as error:
                    dead_letters.append(DeadLetter(input_file.uri, error.stage, error.reason, error.detail))
                    if isinstance(data, bytes):  # read, then refused: a touch of it must not count as a change
                        digests[input_file.filename] = hashlib.sha256(data).hexdigest()
                    self._images_failed.inc()
                    Metrics.counter(METRICS_NAMESPACE, f"failed_{error.reason}").inc()
                    continue
                for event in events:
                    Metrics.counter(METRICS_NAMESPACE, f"event_{event}").inc()
                writer.write(frame_record(record))
                num_examples += 1
                content_keys.append((sha256, input_file.filename, _key_label(input_file)))
                if classes is not None:
                    held = [list(classes.classes), list(classes.objects), classes.dropped]
                    annotated.append([*held, list(classes.mask_ids)] if classes.mask_ids else held)
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
            # ... who each is (its path relative to its source's root) and what its bytes were: an
            # append knows a held input by them wherever its folder is mounted, and compares bytes
            # when its size or time differ (``sources`` is only a hint; see reading.source_digests).
            "input_filenames": [input_file.filename for input_file in shard.inputs],
            "input_sha256": [_source_digests(f, digests, mask_digests) for f in shard.inputs],
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
        if annotated:
            done["annotated"] = annotated
        if any(input_file.annotations is not None for input_file in shard.inputs):
            # ... and what each input's annotations said: boxes redrawn since make it a changed input.
            done["input_annotations"] = [annotation_digest(input_file) for input_file in shard.inputs]
        if self._run_id is not None:
            done["run_id"] = self._run_id
        if self._run_fingerprint:
            done["run_fingerprint"] = self._run_fingerprint
        if self._made_for:
            done["made_for"] = self._made_for
        if self._preprocessing is not None:
            done["preprocessing"] = self._preprocessing
        write_atomically(sidecar_path, json.dumps(done, sort_keys=True).encode("utf-8"))
        if note is not None:  # the sidecar counts the shard's images now
            note.remove()
        self._images_written.inc(num_examples)
        self._bytes_written.inc(writer.bytes)
        self._shards_written.inc()
        _DETAILS.info(
            "wrote %s: %d examples, %.3g MiB, %d dead letters",
            shard.file_name,
            num_examples,
            writer.bytes / 2**20,
            len(dead_letters),
        )
        yield from self._outputs(shard, done)

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
    def _outputs(shard: ShardPlan, done: dict):
        for uri, stage, reason, detail in done["dead_letters"]:
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, DeadLetter(uri, stage, reason, detail))
        for sha256, filename, label in done["content_keys"]:
            yield beam.pvalue.TaggedOutput(CONTENT_KEYS, (sha256, (filename, label)))
        # From the sidecar, so a shard kept by --resume (even one staged by an older version)
        # reports the same counts as a freshly converted one.
        objects: collections.Counter[str] = collections.Counter()
        dropped = 0
        mask_ids: set[int] = set()
        if "annotated" in done:
            # [classes, objects, cut] and, with a semantic mask, its ids.
            classes = collections.Counter(name for names, *_ in done["annotated"] for name in names)
            objects.update(name for _, names, *_ in done["annotated"] for name in names)
            dropped = sum(cut for _, _, cut, *_ in done["annotated"])
            mask_ids.update(i for _, _, _, *ids in done["annotated"] for i in (ids[0] if ids else ()))
        else:
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
            object_counts=tuple(sorted(objects.items())),
            mask_ids=tuple(sorted(mask_ids)),
            objects_cut=dropped,
        )


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


def _source_digests(input_file: InputFile, digests: dict[str, str], mask_digests: dict[str, str]) -> list:
    """[sha256 of the source's bytes], then its mask's when it has one (None where unread), in the
    shape of reading.source_digests."""
    annotations = input_file.annotations
    with_mask = annotations is not None and annotations.mask_uri is not None
    found = [digests.get(input_file.filename)]
    return [*found, mask_digests.get(input_file.filename)] if with_mask else found


def _key_label(input_file: InputFile) -> str:
    """The label a content key records (the duplicate report names it): records.content_label."""
    return content_label(input_file)


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

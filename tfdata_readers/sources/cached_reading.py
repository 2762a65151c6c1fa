"""The tf.data side of the shard cache: each shard piece reads a verified local copy, and no Python
runs inside tf.data.

TensorFlow's iterator destructor holds Python's GIL while it waits for the pipeline's threads, so a
Python call inside tf.data (`py_function`) can hang a process that drops an iterator (at exit,
most often). So the pipeline and the cache meet only through TensorFlow variables, which the
pipeline's own ops update and read, and one thread of this process (`_Leaser`) serves:

- when the interleave makes a shard piece, the pipeline counts the shard as asked for, then waits
  with TensorFlow's ops alone (a short sleep between reads of a variable; dropping the iterator
  cancels the wait) until that ask is granted; then `TFRecordDataset` opens the copy, whose path
  is a function of the shard's digest;
- the thread sees the count, leases a verified copy (downloading it first if need be, over the
  cache's limit rather than waiting, see shard_cache.py) and grants the ask; a failed download is
  granted as a failure, and the piece fails with its message;
- once the piece's records are read, the pipeline counts the shard as done, and the thread ends
  the lease when every ask of it is done;
- the prefetch ahead of the interleave counts the pieces it pulls as announced, in the pass's
  order (shuffled or not): the thread starts their downloads in the background, when there is room.

A checkpointed iterator keeps each open piece's input, and restoring it runs the piece's function
again: one restored in a new process (whose cache may have lost the copy) asks for the shard, and
its reader goes on from the saved offset once the copy is leased again.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from tfdata_readers.sources.manifest import ShardInfo
from tfdata_readers.sources.shard_cache import ShardCache
from tfdata_readers.sources.storage import S3Options

__all__ = ["CachedShards", "shared_cache"]

logger = logging.getLogger(__name__)

_CACHES: dict[tuple[str, int, S3Options | None], ShardCache] = {}
_CACHES_LOCK = threading.Lock()

# Rows of a reader's counts, per shard.
_ASKED, _DONE, _ANNOUNCED = 0, 1, 2
# How often the thread looks for new counts, and a waiting piece at its grant.
_POLL_S = 0.005
_WAIT_POLL_US = 2000
# A piece waits this long for its copy (a download, verified) before it fails, naming the shard.
_WAIT_LIMIT_S = 3600


def shared_cache(directory: str, limit_bytes: int, s3: S3Options | None = None) -> ShardCache:
    """This process's cache of ``directory``: every dataset read through one folder (from one store)
    shares its leases (one lock per shard file per process)."""
    with _CACHES_LOCK:
        key = (directory, limit_bytes, s3)
        if key not in _CACHES:
            _CACHES[key] = ShardCache(directory, limit_bytes, s3=s3)
        return _CACHES[key]


def _host_variable(initial: tf.Tensor) -> resource_variable_ops.ResourceVariable:
    """A plain variable on the host, made outside any function and any distribution strategy: a
    strategy's variable (made under its scope, where many users build their input) cannot be
    updated from a tf.data function, and a GPU has no int64 scatter."""
    with tf.init_scope(), tf.device("/cpu:0"):
        return resource_variable_ops.ResourceVariable(initial, trainable=False)


def _sleeping(dataset: tf.data.Dataset, microseconds: int) -> tf.data.Dataset:
    """``dataset``, each element handed on after a sleep (TensorFlow's own op; no Python)."""
    flat = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=tf.constant(microseconds, tf.int64),
        output_types=[spec.dtype for spec in flat],
        output_shapes=[spec.shape for spec in flat],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


class _Leaser:
    """The one thread of this process that leases and grants what every reader's counts ask for.

    Every count also moves ``changes``, so an idle thread reads one variable per poll."""

    def __init__(self) -> None:
        self.changes = _host_variable(tf.constant(0, tf.int64))
        self._readers: list[CachedShards] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, reader: CachedShards) -> None:
        with self._lock:
            self._readers.append(reader)
            if self._thread is None:
                # A daemon, stopped at exit before the interpreter goes: a reader dropped part-way
                # must not keep its process alive, and TensorFlow must not be called during teardown.
                self._thread = threading.Thread(target=self._run, name="shard-cache-leases", daemon=True)
                self._thread.start()
                atexit.register(self.stop)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        seen = None
        while not self._stop.wait(_POLL_S):
            changes = int(self.changes.numpy())
            if changes == seen:
                continue
            seen = changes
            with self._lock:
                readers = list(self._readers)
            for reader in readers:
                try:
                    reader.serve()
                except Exception:  # noqa: BLE001 - one reader's fault must not stop the others' leases
                    logger.exception("the shard cache could not serve a reader; its pieces will fail")
                    with self._lock:
                        self._readers.remove(reader)


_LEASER: _Leaser | None = None


def _leaser() -> _Leaser:
    global _LEASER  # noqa: PLW0603 - one thread per process, made on first use
    with _CACHES_LOCK:
        if _LEASER is None:
            _LEASER = _Leaser()
        return _LEASER


class CachedShards:
    """The shards of one reader, as the cache serves them.

    ``open_at_once`` is how many pieces the reader reads at once (its interleave's cycle): a
    cache that cannot hold that many of its largest shards is refused here, at start-up, so that
    a reader alone stays under the limit (readers sharing the folder may take it over the limit by
    what they lease, see shard_cache.py). ``where`` names the shards in that error ("split 'train'").
    """

    def __init__(self, cache: ShardCache, shards: tuple[ShardInfo, ...], *, open_at_once: int, where: str):
        largest = max(s.bytes for s in shards)
        if cache.limit_bytes < open_at_once * largest:
            raise ValueError(
                f"ReadConfig.cache_limit_bytes={cache.limit_bytes} cannot hold the {open_at_once} shards this "
                f"reader has open at once (cycle_length; the largest shard of {where} is {largest} bytes): "
                f"raise it to at least {open_at_once * largest}, or lower cycle_length"
            )
        self._cache = cache
        self._shards = tuple(shards)
        count = len(self._shards)
        with tf.init_scope(), tf.device("/cpu:0"):
            self._paths = tf.constant([s.path for s in self._shards], tf.string)
            self._copies = tf.constant([cache.path_of(s.sha256) for s in self._shards], tf.string)
            # Why a shard's ask failed, for the piece that waits for it.
            self._errors = tf.lookup.experimental.MutableHashTable(tf.int64, tf.string, default_value="")
        self._counts = _host_variable(tf.zeros([3, count], tf.int64))
        # Per shard: the asks served so far (a lease held for them), or minus the ask that failed.
        self._granted = _host_variable(tf.zeros([count], tf.int64))
        # The thread's own view: which shards it leases, what it granted, what it announced.
        self._held = [False] * count
        self._served = np.zeros([count], np.int64)
        self._failed_at = np.zeros([count], np.int64)
        self._announced = np.zeros([count], np.int64)
        self._leaser = _leaser()
        self._leaser.register(self)

    # -- in the pipeline: TensorFlow ops only -------------------------------------------------

    def _index_of(self, path: tf.Tensor) -> tf.Tensor:
        return tf.argmax(tf.cast(tf.equal(self._paths, path), tf.int32), output_type=tf.int64)

    def _count(self, row: int, index: tf.Tensor) -> tf.Operation:
        cell = tf.reshape(tf.stack([tf.constant(row, tf.int64), index]), [1, 2])
        counted = self._counts.scatter_nd_add(cell, tf.ones([1], tf.int64))
        with tf.control_dependencies([counted]):
            return tf.group(self._leaser.changes.assign_add(1))

    def _copy_of(self, index: tf.Tensor) -> tf.Tensor:
        """The local path of the shard ``index``'s copy, once the thread has leased it for this ask."""
        with tf.control_dependencies([self._count(_ASKED, index)]):
            need = self._counts.read_value()[_ASKED, index]

        def waiting(_: tf.Tensor) -> tf.Tensor:
            granted = self._granted.read_value()[index]
            return tf.logical_and(granted < need, granted > -need)

        polls = tf.data.Dataset.range(_WAIT_LIMIT_S * 1_000_000 // _WAIT_POLL_US).take_while(waiting)
        waited = _sleeping(polls, _WAIT_POLL_US).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
        with tf.control_dependencies([waited]):  # the failure's message is written before its grant
            granted = self._granted.read_value()[index]
            message = tf.where(
                granted <= -need,
                self._errors.lookup(index),
                tf.strings.join(
                    [
                        "no verified copy of shard ",
                        self._paths[index],
                        f" came from the shard cache at {self._cache.directory} within {_WAIT_LIMIT_S} s",
                    ]
                ),
            )
        ready = tf.debugging.Assert(granted >= need, [message], summarize=1)
        with tf.control_dependencies([ready]):
            return tf.identity(self._copies[index])

    def announce(self, path: tf.Tensor) -> tf.Tensor:
        """``path`` itself, once counted as announced: its download starts in the background (if
        there is room)."""
        with tf.control_dependencies([self._count(_ANNOUNCED, self._index_of(path))]):
            return tf.identity(path)

    def read_through(self, path: tf.Tensor, read: Callable[[tf.Tensor], tf.data.Dataset]) -> tf.data.Dataset:
        """``read(local path)`` of the shard ``path``'s cached copy, leased while it is read.

        The copy is asked for when the piece's first record is, not when the interleave makes the
        piece, inside the function that builds the piece's reader: a restored iterator runs that
        function again (see the module's docstring)."""
        index = self._index_of(path)
        records = tf.data.Dataset.from_tensors(index).flat_map(lambda i: read(self._copy_of(i)))

        def mark_done(i: tf.Tensor) -> tf.Tensor:
            with tf.control_dependencies([self._count(_DONE, i)]):
                return tf.identity(tf.constant(False))

        done = (
            tf.data.Dataset.from_tensors(index)
            .filter(mark_done)
            .map(lambda i: tuple(tf.constant("") for _ in records.element_spec))
        )
        return records.concatenate(done)

    # -- in the thread ------------------------------------------------------------------------

    def serve(self) -> None:
        """Ends the leases every ask of which is done, starts the announced downloads, and leases
        and grants what is asked for. Releases come first, so a reader alone stays under the limit."""
        asked, done, announced = self._counts.numpy()  # one moment's counts
        for i in np.flatnonzero((asked == done) & np.array(self._held, bool)):
            self._cache.release(self._shards[i].sha256)
            self._held[i] = False
        for i in np.flatnonzero(announced > self._announced):
            self._announced[i] = announced[i]
            shard = self._shards[i]
            self._cache.announce(shard.path, shard.sha256, shard.bytes)
        for i in np.flatnonzero((asked > done) & (asked > self._served) & (asked > self._failed_at)):
            self._grant(int(i), int(asked[i]))

    def _grant(self, index: int, asks: int) -> None:
        shard = self._shards[index]
        try:
            if not self._held[index]:
                self._cache.acquire(shard.path, shard.sha256, shard.bytes)
                self._held[index] = True
        except Exception as error:  # noqa: BLE001 - the piece that waits for it raises it
            self._failed_at[index] = asks
            self._errors.insert(tf.constant([index], tf.int64), tf.constant([f"{type(error).__name__}: {error}"]))
            value = -asks
        else:
            self._served[index] = asks
            value = asks
        self._granted.scatter_nd_update(tf.constant([[index]], tf.int64), tf.constant([value], tf.int64))

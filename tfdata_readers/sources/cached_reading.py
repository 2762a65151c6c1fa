"""The tf.data side of the shard cache: a shard piece's path becomes a verified local copy's.

One Python call per shard piece (never per record): `local_path` maps a remote shard path to its
cached copy when the piece's turn comes, `announce` starts the downloads of the pieces a prefetch
holds ahead of the interleave (the order the reader reads them in, shuffled or not), and
`read_through` reads a piece from the copy and ends its lease once its records are read.
Everything after the path stays in TensorFlow's readers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import tensorflow as tf

from tfdata_readers.sources.manifest import ShardInfo
from tfdata_readers.sources.shard_cache import ShardCache
from tfdata_readers.sources.storage import S3Options

__all__ = ["CachedShards", "shared_cache"]

_CACHES: dict[tuple[str, int, S3Options | None], ShardCache] = {}
_CACHES_LOCK = threading.Lock()


def shared_cache(directory: str, limit_bytes: int, s3: S3Options | None = None) -> ShardCache:
    """This process's cache of ``directory``: every dataset read through one folder (from one store)
    shares its leases (one lock per shard file per process)."""
    with _CACHES_LOCK:
        key = (directory, limit_bytes, s3)
        if key not in _CACHES:
            _CACHES[key] = ShardCache(directory, limit_bytes, s3=s3)
        return _CACHES[key]


class CachedShards:
    """The shards of one reader, as the cache serves them.

    ``open_at_once`` is how many pieces the reader reads at once (its interleave's cycle): a
    cache that cannot hold that many of its largest shards is refused here, at start-up, rather
    than found full mid-epoch. ``where`` names the shards in that error ("split 'train'").
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
        self._shards = {s.path: s for s in shards}

    def _shard(self, path: tf.Tensor) -> ShardInfo:
        return self._shards[path.numpy().decode("utf-8")]

    def _call(self, fn: Callable[[tf.Tensor], object], path: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        out = tf.py_function(fn, [path], dtype)
        out.set_shape([])
        return out

    def local_path(self, path: tf.Tensor) -> tf.Tensor:
        """The cached copy's path of the shard ``path`` (downloaded and verified first if need be), leased."""

        def acquire(p: tf.Tensor) -> str:
            shard = self._shard(p)
            return self._cache.acquire(shard.path, shard.sha256, shard.bytes)

        return self._call(acquire, path, tf.string)

    def announce(self, path: tf.Tensor) -> tf.Tensor:
        """``path`` itself, once its download has been started in the background (if there is room)."""

        def start(p: tf.Tensor) -> str:
            shard = self._shard(p)
            self._cache.announce(shard.path, shard.sha256, shard.bytes)
            return shard.path

        return self._call(start, path, tf.string)

    def read_through(self, path: tf.Tensor, read: Callable[[tf.Tensor], tf.data.Dataset]) -> tf.data.Dataset:
        """``read(local path)`` of the shard ``path``'s cached copy, leased while it is read.

        The copy is asked for when the piece's first record is, not when the interleave makes the
        piece: the interleave makes its next pieces on one thread, and a download waiting there
        for room would stop the reads that free it. It is asked for inside the function that
        builds the piece's reader, given the shard's own path: a checkpointed iterator keeps that
        function's input, so one restored in a new process (whose cache may have lost the copy)
        leases, downloads and verifies the shard again before its reader goes on from the saved
        offset.
        """

        def release(p: tf.Tensor) -> bool:
            self._cache.release(self._shard(p).sha256)
            return False

        records = tf.data.Dataset.from_tensors(path).flat_map(lambda p: read(self.local_path(p)))
        done = (
            tf.data.Dataset.from_tensors(path)
            .filter(lambda p: self._call(release, p, tf.bool))
            .map(lambda p: tuple(p for _ in records.element_spec))
        )
        return records.concatenate(done)

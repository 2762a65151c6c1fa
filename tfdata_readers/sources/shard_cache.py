"""A bounded local cache of a remote dataset's shards, verified before use and shared by processes.

TensorFlow 2.21 cannot open s3:// (schemes.py), and copying a whole dataset to local disk before
training wastes the disk and the wait. The reader instead asks this cache for each shard when its
turn comes (and announces the next ones ahead, so that they download while it reads):

- **Content-addressed.** A shard is stored as ``<sha256>.tfrecord``, the digest the manifest
  gives it. Shards are immutable (a new version writes new files), so a cached file never goes
  stale, two datasets sharing a shard share its copy, and a file whose name is its digest is
  checked once, when it is downloaded: its bytes are hashed before the atomic rename that
  publishes it, and a mismatch is an error naming the shard, never data read.
- **Atomic publication, one download.** A download goes to a ``.part`` file and is renamed into
  place; a lock per shard (``flock``) makes a second process wait for the first's download
  rather than fetch it again. A process killed mid-download leaves a ``.part`` file that the next
  one removes (no download holds its shard's lock any more).
- **Bounded, without evicting what is read, never waiting on another process.** Before a
  download, the least recently used shards that nobody leases are removed until the new one fits
  under ``limit_bytes``. A shard being read is leased: its reader holds a shared ``flock`` on it,
  and eviction removes only a file it can lock exclusively, so no process (this one or another on
  the host) loses a shard it still reads. The limit bounds the shards nobody leases: when the
  leased ones alone fill it, a reader that needs a shard downloads it anyway, over the limit,
  rather than wait for room only another reader could free (two readers each holding one lease
  and waiting for the other's would wait for ever). So the folder holds at most the limit plus
  the shards live readers lease (each reader, its ``cycle_length``); a lease dies with its
  process (a ``flock``), so a killed reader's shards become evictable at once. A download
  announced ahead never goes over the limit: it is skipped when there is no room.

Downloads use boto3's managed transfer (parallel ranged GETs, retries): the library made for it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from stat import S_ISREG

from tfdata_readers.sources import storage

__all__ = ["CacheFullError", "ShardCache", "ShardCacheError", "ShardDigestError"]

logger = logging.getLogger(__name__)

_SUFFIX = ".tfrecord"
# Only names the cache makes are ever counted or removed: a published shard, and a download's part
# file (with, after it, the temporary name boto3 downloads to: `<part>.<8 hex>`). Anything else in
# the folder (a user's own `data.tfrecord`, a folder named like a shard) is left alone.
_SHARD = re.compile(r"^[0-9a-f]{64}\.tfrecord$")
_PART = re.compile(
    r"^\.(?P<sha>[0-9a-f]{64})\.(?P<bytes>\d+)\.(?P<pid>\d+)\.[0-9a-f]+\.part(?P<sdk_temp>\.[0-9A-Fa-f]+)?$"
)
_CHUNK = 8 * 2**20


class ShardDigestError(IOError):
    """A downloaded shard's bytes are not those the manifest's sha256 names."""


class CacheFullError(IOError):
    """A shard is larger than the whole cache may hold."""


class ShardCacheError(IOError):
    """The cache folder holds, under a shard's name, something the cache did not put there."""


def _sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _lock_exclusively_now(fd: int) -> bool:
    """Takes an exclusive flock on ``fd`` if no one else holds one (True), without waiting (False)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


class ShardCache:
    """Shards of remote datasets as local files, under ``directory``, at most ``limit_bytes``.

    ``acquire`` returns a verified local copy and leases it until ``release`` (over the limit when
    leased shards fill it, never waiting); ``announce`` starts a download in the background only
    when there is room for it among shards nobody leases.
    """

    def __init__(
        self,
        directory: str,
        limit_bytes: int,
        *,
        download_threads: int = 4,
        s3: storage.S3Options | None = None,
    ):
        if limit_bytes <= 0:
            raise ValueError(f"cache_limit_bytes must be positive (got {limit_bytes!r})")
        self.directory = os.path.abspath(directory)
        self.limit_bytes = int(limit_bytes)
        self._s3 = s3  # downloads run on other threads: the caller's S3 options are given, not inherited
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._leases: dict[str, tuple[int, int]] = {}  # sha256 -> (open fd holding LOCK_SH, count)
        self._pending: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=download_threads, thread_name_prefix="shard-cache")

    # -- paths and locks ---------------------------------------------------------------------

    def path_of(self, sha256: str) -> str:
        """Where the shard whose digest is ``sha256`` lives once cached."""
        return os.path.join(self.directory, sha256 + _SUFFIX)

    def _open_lock(self, name: str) -> int:
        path = os.path.join(self.directory, name)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder was removed while this process ran: make it again
            os.makedirs(self.directory, exist_ok=True)
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def _downloading(self, sha256: str) -> bool:
        """Whether a download of the shard is under way, here or in another process: its downloader
        holds the shard's lock (`_download`). A lock, not the pid in the part file's name: a pid is
        reused (a restarted container's trainer is pid 1 again), and a lock dies with its process."""
        fd = self._open_lock(f".{sha256}.lock")
        try:
            return not _lock_exclusively_now(fd)
        finally:
            os.close(fd)  # closing drops the lock if it was taken

    @contextlib.contextmanager
    def _flock(self, name: str, kind: int = fcntl.LOCK_EX) -> Iterator[None]:
        fd = self._open_lock(name)
        try:
            fcntl.flock(fd, kind)
            yield
        finally:
            os.close(fd)

    # -- leases ------------------------------------------------------------------------------

    def _lease(self, sha256: str) -> bool:
        """Takes a shared lock on the cached file (True), or False when it is not (or no longer) there."""
        with self._lock:
            if sha256 in self._leases:
                fd, count = self._leases[sha256]
                self._leases[sha256] = (fd, count + 1)
                return True
        path = self.path_of(sha256)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ShardCacheError(
                f"{path} in the shard cache is not a file: the cache folder ({self.directory}) must hold only what "
                "the cache puts there; remove it, or give ReadConfig.cache_dir a folder of its own"
            )
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino  # not evicted between the open and the lock
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return False
        os.utime(path)  # the recency that eviction orders by
        with self._lock:
            if sha256 in self._leases:  # another thread leased it meanwhile: keep one fd
                other, count = self._leases[sha256]
                self._leases[sha256] = (other, count + 1)
                os.close(fd)
            else:
                self._leases[sha256] = (fd, 1)
        return True

    def release(self, sha256: str) -> None:
        """Ends one lease of the shard: once none is left, eviction may remove it."""
        with self._lock:
            if sha256 not in self._leases:  # its acquire failed: the piece's error is the one to see
                return
            fd, count = self._leases[sha256]
            if count > 1:
                self._leases[sha256] = (fd, count - 1)
                return
            del self._leases[sha256]
        os.close(fd)
        self._trim()

    def _trim(self) -> None:
        """Evicts shards nobody leases, least recently used first, until the cache is within its
        limit again: a download that had to go over it (``_reserve(over_limit=True)``, while other
        readers' leases filled it) leaves no excess once those shards are released."""
        with self._flock(".cache.lock"):
            self._evict_until_room(*self._held_bytes(downloading=""), room=0)

    def _evict_until_room(self, total: int, shards: list[tuple[float, str, int]], *, room: int) -> int:
        """Evicts shards nobody leases, least recently used first, until ``room`` more bytes fit
        within the limit (or none is left to evict); returns the bytes then held. Under the cache's lock."""
        for _, name, held in shards:
            if total + room <= self.limit_bytes:
                break
            if name[: -len(_SUFFIX)] not in self._leases and self._evict_one(name):
                total -= held
        return total

    # -- room --------------------------------------------------------------------------------

    def _held_bytes(self, downloading: str) -> tuple[int, list[tuple[float, str, int]]]:
        """(bytes the cache holds, counting downloads under way, [(last use, file, bytes)] of the
        published shards). A dead process's part file is removed on the way."""
        total, shards = 0, []
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if _SHARD.match(name):
                try:
                    stat = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not S_ISREG(stat.st_mode):
                    continue  # not the cache's: acquiring that shard says so (_lease)
                total += stat.st_size
                shards.append((stat.st_mtime, name, stat.st_size))
            elif match := _PART.match(name):
                # The caller holds the lock of the shard it downloads (`downloading`), so a part file of
                # that shard is another's, left behind: downloads of one shard take turns on its lock.
                if match["sha"] != downloading and self._downloading(match["sha"]):
                    if not match["sdk_temp"]:  # the reserved part counts the download's bytes, once
                        total += int(match["bytes"])
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        return total, sorted(shards)

    def _evict_one(self, name: str) -> bool:
        path = os.path.join(self.directory, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            locked = _lock_exclusively_now(fd)  # fails while any reader leases it
        except OSError:
            os.close(fd)
            raise
        if not locked:
            os.close(fd)
            return False
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.unlink(path)
                return True
            return False
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def _reserve(self, sha256: str, size: int, *, over_limit: bool) -> str | None:
        """Makes room for ``size`` bytes by evicting shards nobody leases (least recently used first)
        and creates the part file that holds them (its name counts them for every process). When the
        leased shards leave no room: with ``over_limit`` the part file is made anyway (the reader
        needs the shard now, and waiting could wait for ever on another reader); otherwise None."""
        if size > self.limit_bytes:
            raise CacheFullError(
                f"a shard of {size} bytes is larger than the cache's limit ({self.limit_bytes} bytes): "
                "raise ReadConfig.cache_limit_bytes"
            )
        with self._flock(".cache.lock"):
            total = self._evict_until_room(*self._held_bytes(downloading=sha256), room=size)
            if total + size > self.limit_bytes and not over_limit:
                return None
            if total + size > self.limit_bytes:
                logger.debug(
                    "shard cache %s: shards being read fill its %d bytes; %s goes over the limit",
                    self.directory,
                    self.limit_bytes,
                    sha256,
                )
            part = os.path.join(self.directory, f".{sha256}.{size}.{os.getpid()}.{uuid.uuid4().hex}.part")
            open(part, "wb").close()  # noqa: SIM115 - created under the lock: counted from now on
            return part

    # -- downloads ---------------------------------------------------------------------------

    def _download(self, uri: str, sha256: str, size: int, *, over_limit: bool) -> bool:
        """Publishes a verified copy of ``uri`` (True), or False when ``over_limit`` is False and
        there is no room now. One process downloads a shard at a time; the others wait for that
        download (which itself never waits for room) and find it."""
        with self._flock(f".{sha256}.lock"):
            if os.path.exists(self.path_of(sha256)):
                return True
            part = self._reserve(sha256, size, over_limit=over_limit)
            if part is None:
                return False
            try:
                storage.download(uri, part, self._s3)
                got = _sha256_of(part)
                if got != sha256:
                    raise ShardDigestError(
                        f"shard {uri}: its bytes have sha256 {got}, but the manifest says {sha256}: the shard was "
                        "changed or damaged in storage; it is not read (verify-tfrecords on the dataset names what "
                        "else differs, or re-convert)"
                    )
                actual = os.path.getsize(part)
                if actual != size:  # equal digests make this unreachable; kept for a manifest edited by hand
                    raise ShardDigestError(f"shard {uri}: {actual} bytes, the manifest says {size}")
                with open(part, "rb") as handle:
                    os.fsync(handle.fileno())
                os.rename(part, self.path_of(sha256))  # atomic: a reader sees no file or the whole one
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
        return True

    def announce(self, uri: str, sha256: str, size: int) -> None:
        """Starts fetching a shard the reader will soon ask for, if there is room without evicting
        a leased one (never blocks; a failure is left for ``acquire`` to raise)."""
        with self._lock:
            if sha256 in self._pending or os.path.exists(self.path_of(sha256)):
                return
            self._pending[sha256] = self._pool.submit(self._download, uri, sha256, size, over_limit=False)

    def acquire(self, uri: str, sha256: str, size: int) -> str:
        """The local path of a verified copy of the shard ``uri``, leased until ``release(sha256)``."""
        with self._lock:
            pending = self._pending.pop(sha256, None)
        if pending is not None:
            with contextlib.suppress(Exception):  # its error, if any, comes again from the download below
                pending.result()
        for _ in range(100):
            if self._lease(sha256):
                return self.path_of(sha256)
            self._download(uri, sha256, size, over_limit=True)
        # Another process evicts only unleased copies: a fresh copy lost 100 times between its
        # publication and its lease means something else empties the folder.
        raise ShardCacheError(
            f"shard {uri}: its copy in {self.directory} was removed again and again before it could be read; "
            "give ReadConfig.cache_dir a folder of its own"
        )

    def close(self) -> None:
        """Stops background downloads and ends every lease."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            leases, self._leases = self._leases, {}
        for fd, _ in leases.values():
            os.close(fd)

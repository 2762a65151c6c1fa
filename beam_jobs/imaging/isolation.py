"""Running risky decoders in a child process, so one file cannot hang or kill a worker."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import math
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable

from beam_jobs.errors import BadInputError, Reason, Stage, WorkerShutdownError

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DecoderStartupError",
    "ISOLATION_POLICIES",
    "IsolatedRunner",
    "needs_isolation",
]

# Starting Python and importing Beam, Pillow and numpy takes a second on an idle machine, and
# tens of seconds on a cold or overloaded worker. This limit only catches a child that can never
# start; it is deliberately far above any decode timeout, which start-up is not charged to.
DEFAULT_STARTUP_TIMEOUT_S = 300.0

ISOLATION_POLICIES = ("none", "risky", "all")
# libjpeg-turbo and libpng decode nearly every photo and are the most hardened decoders Pillow
# uses, so they stay on the in-process fast path under the default "risky" policy. Everything
# else (TIFF, GIF, BMP, WebP) is rarer, and TIFF in particular has a long history of decoder bugs.
_FAST_PATH_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


def needs_isolation(data: bytes, policy: str) -> bool:
    """Whether ``data`` is decoded in the child process under ``policy``."""
    if policy not in ISOLATION_POLICIES:
        raise ValueError(f"isolation must be one of {ISOLATION_POLICIES} (got {policy!r})")
    if policy == "none":
        return False
    if policy == "all":
        return True
    return not data.startswith(_FAST_PATH_MAGIC)


class DecoderStartupError(WorkerShutdownError):
    """The isolated decoder process did not become ready: it failed to start or to import the
    decoder's modules, or was still starting after its start-up limit. No input is to blame, so,
    like a worker shutting down, it fails the shard (never staged, so a retry or a --resume
    converts it again) rather than dead-lettering the shard's images."""


def _modules_to_import(function: Callable, args: Iterable) -> frozenset[str]:
    """The modules a child imports to unpickle a call: the function's and its arguments' types'.

    Importing them is start-up work, done before the decode clock starts. "__main__" is left out:
    a spawned child re-imports the parent's main module while starting, before it takes work.
    """
    while isinstance(function, functools.partial):
        function = function.func
    names = {getattr(function, "__module__", None), *(type(arg).__module__ for arg in args)}
    return frozenset(name for name in names if name and name not in ("builtins", "__main__"))


def _import_in_child(names: tuple[str, ...]) -> int:
    """Runs in the child: imports the modules the next calls need; its answer says it is ready."""
    for name in names:
        importlib.import_module(name)
    return os.getpid()


def _check_timeout(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds (got {value!r})")


class IsolatedRunner:
    """Calls a picklable function in one long-lived child process, with a timeout.

    A call that takes longer than ``timeout_s`` has its child killed and raises BadInputError
    (decoder_timeout); a child that dies (segfault, abort, out of memory) during a call raises
    BadInputError (decoder_crashed). Either way a fresh child is started at once, to serve the
    next call. The child is started with "spawn", never "fork": forking a Beam worker with live
    gRPC threads is unsafe.

    The decode clock covers only the call itself. Before it starts, the child must have answered
    that it is ready: Python started and the call's modules imported (see _modules_to_import).
    That start-up has its own, generous limit, ``startup_timeout_s``; a child that misses it, or
    cannot import the decoder, raises DecoderStartupError, which blames no image. Nor is a child
    that died while idle blamed on the next file: it is replaced before the call is sent.

    Why not Beam's ``with_exception_handling(use_subprocess=True, timeout=...)``: it isolates a
    whole element, and here an element is a whole shard, so one hanging file would cost every
    image of its shard, and every image would pay the trip to the subprocess. Isolating single
    decodes keeps JPEG and PNG in-process and confines a failure to the one file.
    """

    def __init__(self, *, timeout_s: float, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> None:
        _check_timeout("timeout_s", timeout_s)
        _check_timeout("startup_timeout_s", startup_timeout_s)
        self._timeout_s = timeout_s
        self._startup_timeout_s = startup_timeout_s
        # teardown() may close the runner from another thread while a call is under way.
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ready: concurrent.futures.Future | None = None  # the child's answer to the last imports
        self._imported: frozenset[str] = frozenset()  # what the current child was asked to import
        self._closed = False
        self.calls = 0

    def _prepare(
        self, modules: frozenset[str]
    ) -> tuple[concurrent.futures.ProcessPoolExecutor, concurrent.futures.Future]:
        """The current child (started if need be) and its future answer to importing ``modules``."""
        with self._lock:
            if self._closed:
                raise WorkerShutdownError("the isolated decoder was closed: the worker is shutting down")
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn")
                )
                self._ready, self._imported = None, frozenset()
            missing = modules - self._imported
            if self._ready is None or missing:
                self._ready = self._pool.submit(_import_in_child, tuple(sorted(missing)))
                self._imported |= missing
            return self._pool, self._ready

    def _discard(self, pool: concurrent.futures.ProcessPoolExecutor | None = None) -> None:
        """Kills the child of ``pool`` (by default, the current one) and forgets it."""
        with self._lock:
            if pool is None or pool is self._pool:
                pool, self._pool, self._ready = self._pool, None, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()  # A hung decoder ignores everything gentler.
        pool.shutdown(wait=False, cancel_futures=True)

    def _replace(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Kills the child of ``pool`` and starts its replacement now, so that the replacement's
        start-up overlaps the rest of the shard instead of delaying its next risky file."""
        modules = self._imported
        self._discard(pool)
        try:
            self._prepare(modules)
        except (WorkerShutdownError, RuntimeError):  # Closed meanwhile: nothing to replace.
            pass

    def _wait_until_ready(
        self, ready: concurrent.futures.Future, modules: frozenset[str], pool: concurrent.futures.ProcessPoolExecutor
    ) -> None:
        """Waits, under the start-up limit, for the child's answer that ``modules`` are imported.

        Raises DecoderStartupError, or BrokenProcessPool for a child that died meanwhile."""
        try:
            ready.result(timeout=self._startup_timeout_s)
        except concurrent.futures.TimeoutError:
            self._discard(pool)
            raise DecoderStartupError(
                f"the isolated decoder process was not ready after {self._startup_timeout_s:g} s "
                f"(starting Python and importing {', '.join(sorted(modules)) or 'nothing'}); it was killed"
            ) from None
        except concurrent.futures.CancelledError:
            raise WorkerShutdownError("the isolated decoder was cancelled: the worker is shutting down") from None
        except concurrent.futures.process.BrokenProcessPool:
            raise
        except Exception as error:  # An import failed in the child: a broken worker, not a bad file.
            self._discard(pool)
            raise DecoderStartupError(
                f"the isolated decoder process could not import {', '.join(sorted(modules))}: "
                f"{type(error).__name__}: {error}"
            ) from None

    def _submit(
        self, function: Callable, args: tuple
    ) -> tuple[concurrent.futures.ProcessPoolExecutor, concurrent.futures.Future]:
        """Sends the call to a ready child, replacing one that died before it could take it."""
        modules = _modules_to_import(function, args)
        for _ in range(2):
            pool = None
            try:
                pool, ready = self._prepare(modules)
                self._wait_until_ready(ready, modules, pool)
                return pool, pool.submit(function, *args)
            except concurrent.futures.process.BrokenProcessPool:
                # The child died while idle (killed from outside, say) or while starting: no
                # file's fault, so it is replaced before the call is sent.
                if self._closed:
                    raise WorkerShutdownError("the isolated decoder was closed: the worker is shutting down") from None
                self._discard(pool)
            except WorkerShutdownError:  # DecoderStartupError included: already says what happened.
                raise
            except RuntimeError as error:  # "cannot schedule new futures after shutdown"
                raise WorkerShutdownError(f"the isolated decoder is shutting down: {error}") from None
        raise DecoderStartupError("the isolated decoder process died twice before it could take a call")

    def __call__(self, function: Callable, *args):
        """``function(*args)`` run in the child; BadInputError when the call timed out or the child died during it."""
        self.calls += 1
        pool, future = self._submit(function, args)
        try:
            return future.result(timeout=self._timeout_s)  # The decode clock starts here.
        except concurrent.futures.TimeoutError:
            self._replace(pool)
            raise BadInputError(
                Stage.DECODE,
                Reason.DECODER_TIMEOUT,
                f"decoding took longer than {self._timeout_s:g} s; the decoder was killed",
            ) from None
        except concurrent.futures.CancelledError:
            raise WorkerShutdownError("the isolated decode was cancelled: the worker is shutting down") from None
        except concurrent.futures.process.BrokenProcessPool:
            if self._closed:
                raise WorkerShutdownError("the isolated decoder was closed: the worker is shutting down") from None
            self._replace(pool)
            raise BadInputError(
                Stage.DECODE, Reason.DECODER_CRASHED, "the decoder process died (crash or out of memory) on this file"
            ) from None

    def close(self) -> None:
        """Kills the child for good, at the worker's teardown; a call under way or later ends in WorkerShutdownError."""
        with self._lock:
            self._closed = True
        self._discard()

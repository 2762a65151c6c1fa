"""Running risky decoders in a child process, so one file cannot hang or kill a worker."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Callable

from beam_jobs.errors import BadInputError, Reason, Stage, WorkerShutdownError

__all__ = ["ISOLATION_POLICIES", "IsolatedRunner", "needs_isolation"]

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


class IsolatedRunner:
    """Calls a picklable function in one long-lived child process, with a timeout.

    A call that takes longer than ``timeout_s`` has its child killed and raises BadInputError
    (decoder_timeout); a child that dies (segfault, abort, out of memory) raises BadInputError
    (decoder_crashed). Either way a fresh child serves the next call. The child is started with
    "spawn", never "fork": forking a Beam worker with live gRPC threads is unsafe.

    Why not Beam's ``with_exception_handling(use_subprocess=True, timeout=...)``: it isolates a
    whole element, and here an element is a whole shard, so one hanging file would cost every
    image of its shard, and every image would pay the trip to the subprocess. Isolating single
    decodes keeps JPEG and PNG in-process and confines a failure to the one file.
    """

    def __init__(self, *, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False
        self.calls = 0

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._closed:
            raise WorkerShutdownError("the isolated decoder was closed: the worker is shutting down")
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def _discard(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()  # A hung decoder ignores everything gentler.
        pool.shutdown(wait=False, cancel_futures=True)

    def __call__(self, function: Callable, *args):
        self.calls += 1
        try:
            future = self._executor().submit(function, *args)
        except RuntimeError as error:  # "cannot schedule new futures after shutdown"
            raise WorkerShutdownError(f"the isolated decoder is shutting down: {error}") from None
        try:
            return future.result(timeout=self._timeout_s)
        except concurrent.futures.TimeoutError:
            self._discard()
            raise BadInputError(Stage.DECODE, Reason.DECODER_TIMEOUT,
                                f"decoding took longer than {self._timeout_s:g} s; the decoder was killed") from None
        except concurrent.futures.CancelledError:
            raise WorkerShutdownError("the isolated decode was cancelled: the worker is shutting down") from None
        except concurrent.futures.process.BrokenProcessPool:
            if self._closed:
                raise WorkerShutdownError("the isolated decoder was closed: the worker is shutting down") from None
            self._discard()
            raise BadInputError(Stage.DECODE, Reason.DECODER_CRASHED,
                                "the decoder process died (crash or out of memory) on this file") from None

    def close(self) -> None:
        self._closed = True
        self._discard()

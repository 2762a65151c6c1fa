"""Talks to a tf.data service dispatcher over gRPC, with deadlines: addresses, a handshake, a watchdog.

TensorFlow's own client retries a dispatcher it cannot reach, or one that is not a dispatcher,
without a word and without end, so a wrong address or a stopped service would look like a hung
trainer. This module asks the dispatcher directly (its `GetVersion` and `GetWorkers` calls, the
ones TensorFlow's client and workers make first), always with a deadline, and turns every way
that fails into one line naming the address.

No TensorFlow import: `python -m tfdata_readers.data_service_server` checks its arguments and its
dispatcher with it before TensorFlow loads.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["DispatcherWatchdog", "ask_dispatcher", "parse_host_port"]

_SERVICE = "/tensorflow.data.DispatcherService/"
ACCEPTED_FORMS = "grpc://HOST:PORT or HOST:PORT"


def parse_host_port(text: str, *, flag: str) -> tuple[str, int]:
    """(host, port) from "host:port" or "grpc://host:port"; a ValueError naming `flag` and the
    accepted forms otherwise."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if scheme and scheme.group(1) != "grpc":
        # "http://h:1" would otherwise become host "http://h": an address nobody could resolve.
        raise ValueError(f"{flag} must be {ACCEPTED_FORMS} (got {text!r}: the tf.data service speaks only grpc://)")
    host, sep, port = text.removeprefix("grpc://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} must be {ACCEPTED_FORMS} with a port from 1 to 65535 (got {text!r})")
    return host, int(port)


def _worker_addresses(response: bytes) -> list[str]:
    """The addresses in a serialized `GetWorkersResponse` (field 1: repeated WorkerInfo, whose field 1 is the address).

    Parsed by hand: TensorFlow's wheel does not ship the dispatcher's message classes. Only
    length-delimited fields occur in these two messages.
    """

    def fields(data: bytes) -> list[tuple[int, bytes]]:
        out, i = [], 0
        while i < len(data):
            key, i = _varint(data, i)
            if key & 7 != 2:
                raise ValueError(f"unexpected wire type {key & 7}")
            size, i = _varint(data, i)
            out.append((key >> 3, data[i : i + size]))
            i += size
        return out

    return [
        value.decode()
        for number, info in fields(response)
        if number == 1
        for field, value in fields(info)
        if field == 1
    ]


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def ask_dispatcher(address: str, timeout_s: float) -> list[str]:
    """The worker addresses registered with the tf.data service dispatcher at `address`.

    Raises ConnectionError, in one line naming the address, when nothing listens there, when what
    listens is not a tf.data dispatcher (an HTTP server, a tf.data worker), or when it does not
    answer within `timeout_s`.
    """
    import grpc  # a TensorFlow dependency

    host, port = parse_host_port(address, flag="data_service")
    target = f"{host}:{port}"
    fix = "start one with launch/data_service.sh start, or pass the address it printed"
    try:
        with grpc.insecure_channel(target) as channel:
            channel.unary_unary(_SERVICE + "GetVersion")(b"", timeout=timeout_s)
            response = channel.unary_unary(_SERVICE + "GetWorkers")(b"", timeout=timeout_s)
    except grpc.RpcError as e:
        code, details = e.code(), (e.details() or "").strip()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            reason = "a gRPC server that is not a tf.data dispatcher answers there (a tf.data worker's port?)"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            reason = f"no answer within {timeout_s:g} s (data_service_timeout_s)"
        elif "HTTP/2" in details or "parsing" in details.lower():
            reason = "something that is not a tf.data dispatcher listens there (it does not speak gRPC)"
        else:
            reason = details.rpartition("error: ")[2] or code.name
        raise ConnectionError(f"tf.data service dispatcher grpc://{target} is unreachable ({reason}); {fix}") from None
    try:
        return _worker_addresses(response)
    except (ValueError, IndexError, UnicodeDecodeError):
        raise ConnectionError(
            f"tf.data service dispatcher grpc://{target} gave an answer this reader cannot read (another "
            f"TensorFlow version?): {response[:40]!r}"
        ) from None


def _exit_with(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(1)  # the main thread is blocked inside TensorFlow, where no exception can reach it


class DispatcherWatchdog:
    """A daemon thread that asks the dispatcher every few seconds, and calls `on_lost(message)` once
    when it has not answered for `timeout_s` (default: print the message and end the process with
    exit status 1, because a reader waiting on a stopped service never returns).

    TensorFlow's reader retries a lost dispatcher (and workers that went away with it) forever and
    silently; this turns a stopped service into one line and an exit. It only sees the dispatcher:
    a worker that hangs while the dispatcher answers is not detected. Use as a context manager, or
    call `stop()`.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float,
        *,
        on_lost: Callable[[str], None] | None = None,
        prefix: str = "error: ",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 (got {timeout_s!r})")
        self.address, self.timeout_s = address, float(timeout_s)
        self._on_lost = on_lost or _exit_with
        self._prefix = prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tf.data dispatcher watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = min(5.0, self.timeout_s / 3)
        last_ok, last_error = time.monotonic(), ""
        while not self._stop.wait(interval):
            try:
                ask_dispatcher(self.address, timeout_s=interval)
                last_ok = time.monotonic()
            except ConnectionError as e:
                last_error = str(e).partition("(")[2].rpartition(")")[0]
                if time.monotonic() - last_ok >= self.timeout_s:
                    self._on_lost(
                        f"{self._prefix}the tf.data service dispatcher {self.address} has not answered for "
                        f"{time.monotonic() - last_ok:.0f} s ({last_error}); TensorFlow would wait for it "
                        f"forever, so reading stops. Was the service stopped? Restart it "
                        f"(launch/data_service.sh start) and rerun"
                    )
                    return

    def stop(self) -> None:
        """Ends the watch once reading is over: a dispatcher that stops afterwards no longer ends the process."""
        self._stop.set()

    def __enter__(self) -> DispatcherWatchdog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

"""Runs one tf.data service process, a dispatcher or a worker, until SIGTERM or SIGINT.

    python -m tfdata_readers.data_service_server --role dispatcher --port 5050 \
        --worker_addresses host-a:5051,host-b:5051 [--work_dir DIR]
    python -m tfdata_readers.data_service_server --role worker --port 5051 \
        --dispatcher_address host-d:5050 [--worker_address host-a:5051]

`launch/data_service.sh` runs these on loopback; on real hosts, run the same commands there. The
servers are TensorFlow's own (`tf.data.experimental.service.DispatchServer` / `WorkerServer`);
this module only gives them a command line, settings chosen for the reader's guarantees, and a
clean exit on a signal. It runs only through `tfdata_readers/data_service_server.py` (no
`__main__` here), so every server's command line names `tfdata_readers.data_service_server`,
which is what `launch/data_service.sh` and the benchmarks look for.

Why `--worker_addresses`: evaluation through the service uses static (FILE) sharding, which deals
each worker a fixed part of the files by its index in that list, so the dispatcher must know
every worker up front and each worker must register under the address listed there
(`--worker_address`). Training (dynamic sharding) works with or without the list.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from tfdata_readers.service.dispatcher import ask_dispatcher, parse_host_port

__all__ = ["main"]

# A lost worker is noticed after this long without a heartbeat (TensorFlow's default is a minute),
# so a SIGKILLed worker's tasks are dropped quickly and readers stop waiting for it.
DEFAULT_WORKER_TIMEOUT_MS = 5_000
WORKER_HEARTBEAT_MS = 1_000
# Jobs nobody reads any more (an iterator dropped mid-epoch, an endless training stream) hold
# worker memory until collected; TensorFlow's defaults keep them for minutes.
JOB_GC_CHECK_INTERVAL_MS = 2_000
JOB_GC_TIMEOUT_MS = 10_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tfdata_readers.data_service_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--role", required=True, choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument(
        "--worker_addresses",
        default="",
        help="dispatcher: comma-separated HOST:PORT of every worker (needed for static sharding)",
    )
    parser.add_argument(
        "--work_dir",
        default=None,
        help="dispatcher: directory for its journal, so a restarted dispatcher recovers its jobs; "
        "empty it when the workers change (a journal's old workers break static sharding)",
    )
    parser.add_argument(
        "--worker_timeout_ms",
        type=int,
        default=DEFAULT_WORKER_TIMEOUT_MS,
        help="dispatcher: a worker silent this long is considered lost",
    )
    parser.add_argument("--dispatcher_address", default=None, help="worker: HOST:PORT of the dispatcher")
    parser.add_argument(
        "--dispatcher_timeout_s",
        type=float,
        default=60.0,
        help="worker: how long to wait for the dispatcher to answer before exiting with status 1 [60]",
    )
    parser.add_argument(
        "--worker_address",
        default=None,
        help="worker: HOST:PORT under which clients reach it [localhost:--port]; must match "
        "its entry in the dispatcher's --worker_addresses",
    )
    parser.add_argument(
        "--parent_pid",
        type=int,
        default=None,
        help="stop when this process (a supervisor that restarts this one) is gone, so that no "
        "server outlives it unsupervised",
    )
    return parser


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be from 1 to 65535 (got {args.port})")
    if args.role == "worker":
        if not args.dispatcher_address:
            raise ValueError("--role worker needs --dispatcher_address HOST:PORT")
        parse_host_port(args.dispatcher_address, flag="--dispatcher_address")
        if args.worker_address:
            parse_host_port(args.worker_address, flag="--worker_address")
        if not args.dispatcher_timeout_s > 0:
            raise ValueError(f"--dispatcher_timeout_s must be > 0 (got {args.dispatcher_timeout_s})")
    else:
        for address in filter(None, args.worker_addresses.split(",")):
            parse_host_port(address, flag="--worker_addresses")
        if args.worker_timeout_ms < 1:
            raise ValueError(f"--worker_timeout_ms must be positive (got {args.worker_timeout_ms})")


def _wait_for_dispatcher(address: str, timeout_s: float, prog: str) -> None:
    """Returns once a tf.data dispatcher answers at `address`; exits with status 1 and one line after `timeout_s`.

    TensorFlow's worker blocks registering with a dispatcher that does not answer, silently and
    without end; on a real host the dispatcher may also simply start later, hence the wait.
    """
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            ask_dispatcher(address, timeout_s=min(5.0, timeout_s))
            return
        except ConnectionError as e:
            if time.monotonic() >= deadline:
                print(
                    f"{prog}: error: gave up after {timeout_s:g} s (--dispatcher_timeout_s): {e}",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(1) from None
            if not said:
                print(f"waiting for the tf.data service dispatcher at {address} ({e})", file=sys.stderr, flush=True)
                said = True
        time.sleep(1)


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Sends this process SIGTERM once `parent_pid` is no longer its parent (the supervisor died,
    even of SIGKILL, which it cannot pass on): before the handler is installed that ends the
    process at once, after it the server stops cleanly."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _start(args: argparse.Namespace):
    import tensorflow as tf  # imported only after the arguments are checked: it takes seconds

    service = tf.data.experimental.service
    if args.role == "dispatcher":
        if args.work_dir:
            os.makedirs(args.work_dir, exist_ok=True)
        config = service.DispatcherConfig(
            port=args.port,
            work_dir=args.work_dir,
            fault_tolerant_mode=bool(args.work_dir),
            worker_addresses=[a for a in args.worker_addresses.split(",") if a] or None,
            job_gc_check_interval_ms=JOB_GC_CHECK_INTERVAL_MS,
            job_gc_timeout_ms=JOB_GC_TIMEOUT_MS,
            worker_timeout_ms=args.worker_timeout_ms,
        )
        return service.DispatchServer(config)
    config = service.WorkerConfig(
        dispatcher_address=args.dispatcher_address.removeprefix("grpc://"),
        worker_address=args.worker_address or f"localhost:{args.port}",
        port=args.port,
        heartbeat_interval_ms=WORKER_HEARTBEAT_MS,
    )
    return service.WorkerServer(config)


def main(argv: Sequence[str] | None = None) -> None:
    """Starts the dispatcher or worker the arguments name and serves until SIGTERM or SIGINT, then stops it cleanly."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _check(args)
    except ValueError as e:
        parser.error(str(e))
    if args.parent_pid is not None:
        _watch_parent(args.parent_pid)
    if args.role == "worker":
        _wait_for_dispatcher(args.dispatcher_address, args.dispatcher_timeout_s, parser.prog)
    try:
        server = _start(args)
    except Exception as e:  # a port in use: one line, not a traceback
        print(f"{parser.prog}: error: could not start the {args.role}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    # The servers run on TensorFlow's threads; this thread only waits for a signal to stop them.
    # Installed only now: a worker still registering with a dispatcher that is gone blocks in
    # _start, and must die of SIGTERM's default action rather than wait for a stop it never reaches.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"tf.data service {args.role} listening on port {args.port} (pid {os.getpid()})", flush=True)
    stop.wait()
    print(f"tf.data service {args.role} stopping", flush=True)
    server.stop()
    print(f"tf.data service {args.role} stopped", flush=True)
    # Skips the interpreter's teardown of TensorFlow, which took seconds and has nothing to save.
    os._exit(0)

"""Run in a subprocess: SIGKILL a tf.data service worker mid-epoch and record what the epoch does.

Usage: python data_service_kill_check.py OUT.json DATA_DIR ADDRESS WORKER_PIDFILE MODE [MODE ...]
MODE is "eval static", "eval dynamic" or "train dynamic". For each, the reader is iterated slowly;
after KILL_AFTER batches the worker process under WORKER_PIDFILE's restart loop gets SIGKILL, and
reading goes on to the end of the epoch (evaluation) or for TRAIN_BATCHES batches (training).
Before each mode the killed worker must be back (registered again), so each mode starts from a whole service.
Writes {mode: {"outcome": "completed" | "error", "error": first line, "delivered": n,
"distinct": n, "expected": n, "seconds_after_kill": s, "full_batches": bool}}.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

import tensorflow as tf

BATCH = 4
KILL_AFTER = 5
TRAIN_BATCHES = 150
# Slow enough that the workers (which run ahead of the reader by a few batches) are mid-epoch at the kill.
PAUSE_S = 0.02


def _worker_child(loop_pid: int) -> int:
    """The pid of the worker process that the restart loop `loop_pid` runs now."""
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == loop_pid and b"data_service_server" in cmdline:
                return int(entry.name)
    raise RuntimeError(f"no worker process under restart loop {loop_pid}")


def _registered(address: str, loop_pid: int, port: int, log: pathlib.Path) -> bool:
    """Whether the worker that restart loop `loop_pid` runs now is registered with the dispatcher.

    The dispatcher's list shows the worker's address, but it keeps a killed worker's there too;
    so also the worker's own "listening" line for its current pid, which `data_service_server`
    prints only once TensorFlow's WorkerServer has registered (its start blocks until then).
    """
    from tfdata_readers.service.dispatcher import ask_dispatcher

    try:
        worker = _worker_child(loop_pid)
        listed = f"127.0.0.1:{port}" in ask_dispatcher(address, timeout_s=30)
    except (RuntimeError, ConnectionError):  # between a death and its restart, or a busy dispatcher
        return False
    return listed and f"listening on port {port} (pid {worker})" in log.read_text(errors="replace")


def _wait_registered(address: str, loop_pid: int, port: int, log: pathlib.Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not _registered(address, loop_pid, port, log):
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker on port {port} was not registered with {address} again within {timeout_s} s")
        time.sleep(0.5)


def run_mode(mode: str, data_dir: str, address: str, loop_pid: int, expected: int) -> dict:
    import tfdata_readers

    training = mode.startswith("train")
    dataset = tfdata_readers.make_dataset(
        data_dir,
        "train",
        BATCH,
        with_metadata=True,
        training=training,
        seed=1 if training else None,
        num_epochs=None if training else 1,
        data_service=address,
        data_service_sharding=mode.split()[1],
    )
    keys, sizes, killed_at, result = [], [], None, {}
    try:
        for number, (_, _, meta) in enumerate(dataset, start=1):
            batch = [k.decode() for k in meta["key"].numpy()]
            keys += batch
            sizes.append(len(batch))
            if number == KILL_AFTER:
                os.kill(_worker_child(loop_pid), signal.SIGKILL)
                killed_at = time.monotonic()
            if training and number >= TRAIN_BATCHES:
                break
            time.sleep(PAUSE_S)
        result["outcome"], result["error"] = "completed", ""
    except tf.errors.OpError as e:
        result["outcome"], result["error"] = "error", e.message.strip().splitlines()[0][:600]
    result.update(
        delivered=len(keys),
        distinct=len(set(keys)),
        expected=expected,
        seconds_after_kill=None if killed_at is None else round(time.monotonic() - killed_at, 1),
        full_batches=all(n == BATCH for n in sizes),
        killed=killed_at is not None,
    )
    return result


def main(out: str, data_dir: str, address: str, pidfile: str, *modes: str) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import tfdata_readers

    loop_pid = int(pathlib.Path(pidfile).read_text().split()[0])
    port = int(
        pathlib.Path(pidfile)
        .parent.parent.joinpath("ports")
        .read_text()
        .split("worker_ports=")[1]
        .split()[0]
        .split(",")[int(pathlib.Path(pidfile).stem.split("-")[1])]
    )
    expected = tfdata_readers.num_examples(data_dir, "train")
    results = {}
    log = pathlib.Path(pidfile).parent.parent / "log" / f"{pathlib.Path(pidfile).stem}.log"
    for mode in modes:
        _wait_registered(address, loop_pid, port, log)
        results[mode] = run_mode(mode, data_dir, address, loop_pid, expected)
        print(mode, results[mode], flush=True)
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])

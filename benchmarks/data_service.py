"""Benchmark: what the tf.data service takes off the trainer, against the plain reader in the same run.

Usage: python benchmarks/data_service.py [--work_dir DIR] [--num_images 2000] [--rounds 2] [--repeats 2] [--seconds 3]

On a 2-core host the service cannot add cores, so this measures what it moves:
  - the trainer process's CPU seconds per 1,000 images (user + system, all its threads, over the
    timed window), with and without the service, and the service's own (workers + dispatcher);
  - images/s with the service's workers pinned to core 1 and the trainer to core 0 (`taskset`),
    against the plain reader pinned to core 0: one decoding core against one trainer core that
    only receives batches.
The data is the reader benchmark's: >= 2000 real-photo JPEGs (500x375) converted by the job's CLI
to 224 px JPEG shards. The pipeline is the training one (random crop, flip), batches of 32, as
float32 and as `dtype="uint8"` (a quarter of the bytes to move). The trainer does nothing with a
batch but receive it. Each figure is the median over fresh processes (round-robin over the rows,
so background load hits every row alike) and timed repeats; one service (2 workers, both pinned
to core 1) serves every service row.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

_REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))

BATCH = 32
SIZE = 224
# (row name, service or not, trainer pinned to core 0 or not)
ROWS = (
    ("plain reader, 2 cores", False, False),
    ("plain reader, trainer on core 0", False, True),
    ("service on core 1, trainer on 2 cores", True, False),
    ("service on core 1, trainer on core 0", True, True),
)


def _ensure_shards(work: pathlib.Path, num_images: int, num_shards: int) -> pathlib.Path:
    """The reader benchmark's JPEG shards (the same folder names, so either benchmark reuses them)."""
    from beam_jobs.sample_data import make_photo_tree

    out = work / f"shards_jpeg_beam_{num_images}"
    if (out / "dataset_info.json").exists():
        return out
    src = work / "photos"
    if len(sorted(src.glob("*/*.jpg"))) != num_images:
        make_photo_tree(src, num_images=num_images, size=(500, 375), seed=0)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(src),
            "--output_dir",
            str(out),
            "--image_size",
            str(SIZE),
            "--encoding",
            "jpeg",
            "--num_shards",
            str(num_shards),
        ],
        check=True,
        cwd=_REPO,
    )
    return out


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of `pids` (all their threads), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _service_pids(state_dir: pathlib.Path) -> list[int]:
    """The dispatcher's and the workers' processes (the workers are children of their restart loops)."""
    leaders = [int(p.read_text().split()[0]) for p in (state_dir / "pid").glob("*.pid")]
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"tfdata_readers.data_service_server" in cmdline and int(stat[2]) in leaders:  # its process group
                pids.append(int(entry.name))
    return pids


def _measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """In a fresh process: images/s, this process's CPU s/1000 images and the service's, per repeat."""
    import tensorflow as tf

    import tfdata_readers

    service_pids = [int(p) for p in args.service_pids.split(",") if p]
    dataset = tfdata_readers.make_dataset(
        args.data_dir,
        args.split,
        BATCH,
        training=True,
        seed=0,
        num_epochs=None,
        dtype=args.dtype,
        data_service=args.data_service or None,
    )
    iterator = iter(dataset)
    batch, start = next(iterator), time.perf_counter()
    while time.perf_counter() - start < args.warmup_s:
        batch = next(iterator)
    if tuple(batch[0].shape) != (BATCH, SIZE, SIZE, 3) or batch[0].dtype != tf.as_dtype(args.dtype):
        raise RuntimeError(f"yields {batch[0].dtype} {batch[0].shape}; expected {args.dtype} [32, 224, 224, 3]")
    out: dict[str, list[float]] = {"rate": [], "trainer_cpu": [], "service_cpu": []}
    for _ in range(args.repeats):
        images, wall, cpu, service = 0, time.perf_counter(), time.process_time(), _cpu_seconds(service_pids)
        while time.perf_counter() - wall < args.seconds:
            images += int(next(iterator)[0].shape[0])
        out["rate"].append(images / (time.perf_counter() - wall))
        out["trainer_cpu"].append((time.process_time() - cpu) / images * 1000)
        out["service_cpu"].append((_cpu_seconds(service_pids) - service) / images * 1000)
    return out


def _start_service(state_dir: pathlib.Path) -> str:
    env = {**os.environ, "PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            str(_REPO / "launch" / "data_service.sh"),
            "start",
            "--state_dir",
            str(state_dir),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"launch/data_service.sh start failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _stop_service(state_dir: pathlib.Path) -> None:
    subprocess.run(
        [str(_REPO / "launch" / "data_service.sh"), "stop", "--state_dir", str(state_dir)],
        capture_output=True,
        check=False,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", type=pathlib.Path, default=pathlib.Path("/tmp/tfdata_readers_bench"))
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--num_shards", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="processes per row, run round-robin")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats in each process")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one timed repeat")
    parser.add_argument("--warmup_s", type=float, default=6.0, help="seconds each process reads before timing")
    parser.add_argument("--dtypes", default="float32,uint8")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures here")
    # Internal: one measurement, in a child process.
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", help=argparse.SUPPRESS)
    parser.add_argument("--split", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--data_service", default="", help=argparse.SUPPRESS)
    parser.add_argument("--service_pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print("RESULT " + json.dumps(_measure(args)), flush=True)
        return
    if os.cpu_count() < 2:
        raise SystemExit("this benchmark pins the service and the trainer to two different cores; it needs 2")

    data_dir = _ensure_shards(args.work_dir, args.num_images, args.num_shards)
    info = json.loads((data_dir / "dataset_info.json").read_text())
    split = max(info["splits"], key=lambda name: info["splits"][name]["num_examples"])
    state_dir = args.work_dir / "data_service_state"
    address = _start_service(state_dir)
    try:
        service_pids = ",".join(map(str, _service_pids(state_dir)))
        dtypes = args.dtypes.split(",")
        results = {
            (name, dtype): {"rate": [], "trainer_cpu": [], "service_cpu": []} for name, *_ in ROWS for dtype in dtypes
        }
        for _ in range(args.rounds):
            for dtype in dtypes:
                for name, service, pinned in ROWS:
                    command = [
                        sys.executable,
                        __file__,
                        "--measure",
                        "--data_dir",
                        str(data_dir),
                        "--split",
                        split,
                        "--dtype",
                        dtype,
                        "--repeats",
                        str(args.repeats),
                        "--seconds",
                        str(args.seconds),
                        "--warmup_s",
                        str(args.warmup_s),
                    ]
                    if service:
                        command += ["--data_service", address, "--service_pids", service_pids]
                    if pinned:
                        command = ["taskset", "-c", "0", *command]
                    child = subprocess.run(
                        command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
                    )
                    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
                    if child.returncode != 0 or not lines:
                        raise RuntimeError(f"measuring {name!r} {dtype} failed:\n{child.stderr[-3000:]}")
                    for key, values in json.loads(lines[-1][len("RESULT ") :]).items():
                        results[name, dtype][key] += values
    finally:
        _stop_service(state_dir)

    med = {row: {key: statistics.median(v) for key, v in figures.items()} for row, figures in results.items()}
    print(
        f"\n{info['splits'][split]['num_examples']} real-photo JPEGs at {SIZE}x{SIZE}, training pipeline (crop+flip), "
        f"batches of {BATCH}, {os.cpu_count()} cores; service: 2 workers pinned to core 1; median of "
        f"{args.rounds} processes x {args.repeats} repeats x {args.seconds:g} s"
    )
    print(
        f"{'row':40s} {'dtype':8s} {'img/s':>7s} {'min-max':>11s} {'x pinned plain':>15s} "
        f"{'trainer CPU s/1k img':>21s} {'x plain 2 cores':>16s} {'service CPU s/1k':>17s}"
    )
    for (name, dtype), m in med.items():
        rates = results[name, dtype]["rate"]
        pinned_plain = med["plain reader, trainer on core 0", dtype]["rate"]
        plain_cpu = med["plain reader, 2 cores", dtype]["trainer_cpu"]
        service_cpu = f"{m['service_cpu']:17.2f}" if "service" in name else f"{'-':>17s}"
        print(
            f"{name:40s} {dtype:8s} {m['rate']:7.0f} {min(rates):5.0f}-{max(rates):<5.0f} "
            f"{m['rate'] / pinned_plain:14.2f}x {m['trainer_cpu']:21.2f} {m['trainer_cpu'] / plain_cpu:15.2f}x "
            f"{service_cpu}"
        )
    if args.json:
        args.json.write_text(json.dumps({f"{n} | {d}": v for (n, d), v in results.items()}, indent=2))


if __name__ == "__main__":
    main()

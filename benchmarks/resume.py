"""Benchmark: what resuming mid-epoch costs, by iterator checkpoint and by `initial_step`.

The dataset: N real photos (500x375, the sample tree's) converted to 224x224 JPEG shards. Each
figure comes from a fresh process training-reading (batches of 32, seed 1, float32, the default
1024-record shuffle buffer) and is timed from the first `make_dataset` call to the first batch:

- restart the epoch: `initial_step=0`, the baseline (what a trainer that can only resume at
  epoch boundaries pays, before it redoes the steps it had taken);
- initial_step: resumed half-way through the epoch by skipping the steps taken (their records are
  read, not decoded);
- checkpoint: `tf.train.Checkpoint(iterator=...)` saved half-way through by an earlier process,
  restored into a fresh iterator. Its size on disk and the time to save it are also shown.

    python benchmarks/resume.py                      # 1000 images, 8 shards, 3 repeats
    python benchmarks/resume.py --num_images 400 --repeats 1
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

from _photo_shards import photo_shards

REPO = pathlib.Path(__file__).resolve().parents[1]

_RUN = """
import sys, time
start = time.perf_counter()
import tensorflow as tf
import tfdata_readers as tfr
data_dir, mode, ckpt, half = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
step = half if mode == "initial_step" else 0
dataset = tfr.make_dataset(data_dir, "train", 32, training=True, seed=1, num_epochs=None, initial_step=step)
iterator = iter(dataset)
checkpoint = tf.train.Checkpoint(iterator=iterator)
if mode == "checkpoint":
    checkpoint.restore(tf.train.latest_checkpoint(ckpt)).assert_consumed()
if mode == "save":
    for _ in range(half):
        next(iterator)
    start = time.perf_counter()
    checkpoint.save(ckpt + "/reader")
    print("RESULT", time.perf_counter() - start)
else:
    next(iterator)
    print("RESULT", time.perf_counter() - start)
"""


def _run(*args: str) -> float:
    proc = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"a measurement failed:\n{proc.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "resume_bench")
    parser.add_argument("--num_images", type=int, default=1000)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = args.work_dir
    data = photo_shards(work, args.num_images, args.num_shards)
    half = args.num_images // 32 // 2
    ckpt = work / "checkpoint"
    times: dict[str, list[float]] = {"restart the epoch": [], "initial_step": [], "checkpoint": []}
    saves, sizes = [], []
    for _ in range(args.repeats):
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir(parents=True)
        saves.append(_run(str(data), "save", str(ckpt), str(half)))
        sizes.append(sum(p.stat().st_size for p in ckpt.iterdir()))
        times["restart the epoch"].append(_run(str(data), "restart", str(ckpt), str(half)))
        times["initial_step"].append(_run(str(data), "initial_step", str(ckpt), str(half)))
        times["checkpoint"].append(_run(str(data), "checkpoint", str(ckpt), str(half)))
    shard_bytes = sum(p.stat().st_size for p in data.rglob("*.tfrecord"))
    print(
        f"\n{args.num_images} images ({shard_bytes / 2**20:.1f} MiB of shards), resumed after {half} of "
        f"{args.num_images // 32} steps, {args.repeats} repeats (medians)\n"
    )
    base = statistics.median(times["restart the epoch"])
    print("| resume by | seconds to first batch | vs restart | per repeat | state saved |\n|---|---:|---:|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        saved = {
            "restart the epoch": "the epoch number",
            "initial_step": "the epoch and step numbers",
            "checkpoint": f"{statistics.median(sizes) / 2**20:.1f} MiB, saved in {statistics.median(saves):.2f} s",
        }[name]
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {median:.2f} | {median / base:.2f}x | {shown} | {saved} |")


if __name__ == "__main__":
    main()

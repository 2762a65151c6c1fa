"""Conversion benchmark: the Beam job vs a single-process loop vs a multiprocessing.Pool.

All three do the same per-image work (beam_jobs.convert.convert_image: decode, orient, normalise,
resize, encode, serialise) on the same real-photo JPEGs, and are timed as whole processes
(imports and start-up included), interleaved over several repeats; the table gives medians and
ratios measured in this one run. It also measures JPEG draft decoding on 12-megapixel photos and
the job's peak memory (the whole process tree) at N and 4N images.

    python benchmarks/conversion.py                 # 8000 photos of 500x375, 3 repeats
    python benchmarks/conversion.py --num_images 2000 --repeats 1   # a quick look

Besides the table it draws the rates as a bar chart (--chart, default conversion.png in the work
dir), the single-process loop marked as the baseline; it needs matplotlib (pip install ".[bench]").
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.sample_data import make_photo_tree, source_photo_paths  # noqa: E402
from benchmarks._charts import rate_chart  # noqa: E402

IMAGE_SIZE = 224

# The baselines run as separate processes, exactly as a user would write them.
LOOP = r'''
import pathlib, sys, time
import tensorflow as tf
from beam_jobs.config import ImageConfig
from beam_jobs.convert import convert_image
from beam_jobs.records import InputFile
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
config = ImageConfig(width=224, height=224)
paths = sorted(src.rglob("*.jpg"))
labels = {name: i for i, name in enumerate(sorted({p.parent.name for p in paths}))}
with tf.io.TFRecordWriter(str(out / "train-00000-of-00001.tfrecord")) as writer:
    for p in paths:
        f = InputFile(str(p.relative_to(src)), str(p), label=p.parent.name, label_id=labels[p.parent.name])
        writer.write(convert_image(p.read_bytes(), f, config)[0])
'''

POOL = r'''
import multiprocessing, os, pathlib, sys
import tensorflow as tf
from beam_jobs.config import ImageConfig
from beam_jobs.convert import convert_image
from beam_jobs.records import InputFile
CONFIG = ImageConfig(width=224, height=224)

def work(item):
    path, rel, label, label_id = item
    f = InputFile(rel, path, label=label, label_id=label_id)
    with open(path, "rb") as h:
        return convert_image(h.read(), f, CONFIG)[0]

if __name__ == "__main__":
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    paths = sorted(src.rglob("*.jpg"))
    labels = {name: i for i, name in enumerate(sorted({p.parent.name for p in paths}))}
    items = [(str(p), str(p.relative_to(src)), p.parent.name, labels[p.parent.name]) for p in paths]
    num_shards = 16
    writers = [tf.io.TFRecordWriter(str(out / f"train-{i:05d}-of-{num_shards:05d}.tfrecord")) for i in range(num_shards)]
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        for i, record in enumerate(pool.imap(work, items, chunksize=32)):
            writers[i % num_shards].write(record)
    for w in writers:
        w.close()
'''


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:  # The process ended between samples.
        return 0
    for p in members:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def timed_run(command: list[str], *, cwd: pathlib.Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes, summed over the process tree, sampled every 50 ms)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    process = psutil.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss(process))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed:\n{stderr.decode()[-3000:]}")
    return elapsed, peak


def job_command(src: pathlib.Path, out: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "beam_jobs", "--input", str(src), "--output_dir", str(out),
            "--image_size", str(IMAGE_SIZE), "--overwrite"]


def conversion_table(src: pathlib.Path, work: pathlib.Path, num_images: int, repeats: int) -> dict:
    scripts = {"loop": work / "loop.py", "pool": work / "pool.py"}
    scripts["loop"].write_text(LOOP)
    scripts["pool"].write_text(POOL)
    commands = {
        "Beam job, local runner (all cores)": lambda out: job_command(src, out),
        "single-process loop (Pillow + TFRecordWriter)": lambda out: [sys.executable, str(scripts["loop"]), str(src), str(out)],
        f"multiprocessing.Pool({os.cpu_count()})": lambda out: [sys.executable, str(scripts["pool"]), str(src), str(out)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for repeat in range(repeats):
        for name, make in commands.items():  # Interleaved, so drifting machine load hits all alike.
            out = work / f"out-{repeat}-{len(seconds[name])}-{abs(hash(name))}"
            out.mkdir()
            elapsed, _ = timed_run(make(out), cwd=REPO)
            seconds[name].append(elapsed)
            shutil.rmtree(out)
            print(f"  {name}: {num_images / elapsed:.0f} img/s ({elapsed:.1f} s)", flush=True)
    return {name: num_images / statistics.median(values) for name, values in seconds.items()}


def draft_speedup(work: pathlib.Path, count: int = 12) -> tuple[float, float]:
    """Per-image seconds for 12-megapixel JPEGs to 224 px: (with draft, full decode)."""
    from PIL import Image

    from beam_jobs.decode import decode_image
    from beam_jobs.preprocess import normalize_mode, required_source_size, resize_image

    photos = list(source_photo_paths().values())
    blobs = []
    for i in range(count):
        image = Image.open(photos[i % len(photos)]).convert("RGB").resize((4000, 3000), Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=92)
        blobs.append(buffer.getvalue())

    def per_image(use_draft: bool) -> float:
        need = (lambda size: required_source_size(size, (224, 224), "crop")) if use_draft else None
        timings = []
        for data in blobs:
            start = time.perf_counter()
            image = decode_image(data, max_pixels=10**9, draft_size_for=need).image
            resize_image(normalize_mode(image, channels=3), (224, 224), "crop")
            timings.append(time.perf_counter() - start)
        return statistics.median(timings)

    per_image(True)  # Warm caches.
    return per_image(True), per_image(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory_base", type=int, default=2000, help="N for the N vs 4N peak-memory check")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--chart", type=pathlib.Path, default=None,
                        help="bar chart PNG of the rates [WORK_DIR/conversion.png]")
    args = parser.parse_args()
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="conversion-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"photos-{args.num_images}"
    if not src.exists():
        print(f"making {args.num_images} real-photo JPEGs (500x375) in {src}", flush=True)
        make_photo_tree(src, num_images=args.num_images, size=(500, 375), seed=0)
    print(f"converting {args.num_images} photos to {IMAGE_SIZE} px JPEG shards, {args.repeats} repeats, "
          f"{os.cpu_count()} cores", flush=True)
    rates = conversion_table(src, work, args.num_images, args.repeats)

    draft, full = draft_speedup(work)

    memory = {}
    for n in (args.memory_base, 4 * args.memory_base):
        tree = work / f"photos-{n}"
        if not tree.exists():
            make_photo_tree(tree, num_images=n, size=(500, 375), seed=0)
        out = work / f"mem-{n}"
        out.mkdir(exist_ok=True)
        _, peak = timed_run(job_command(tree, out), cwd=REPO)
        memory[n] = peak
        shutil.rmtree(out)

    job, loop, pool = rates.values()
    print()
    print(f"| conversion ({args.num_images} photos 500x375 -> {IMAGE_SIZE} px JPEG, median of {args.repeats}) "
          "| images/s | job / this |")
    print("|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.0f} | {job / rate:.2f}x |")
    print()
    print("| check | measured | target |")
    print("|---|---:|---:|")
    print(f"| job / pool | {job / pool:.2f}x | >= 0.9x |")
    print(f"| job / single loop | {job / loop:.2f}x | >= 1.6x |")
    print(f"| 12 MP JPEG to 224 px, per image: full decode / draft decode | {full * 1000:.0f} ms / "
          f"{draft * 1000:.0f} ms = {full / draft:.1f}x | >= 4x |")
    small, large = memory[args.memory_base], memory[4 * args.memory_base]
    print(f"| job peak RSS (process tree), {args.memory_base} -> {4 * args.memory_base} images | "
          f"{small / 2**20:.0f} MB -> {large / 2**20:.0f} MB = +{(large / small - 1) * 100:.0f}% | <= +25% |")
    chart = rate_chart(
        rates, args.chart or work / "conversion.png", baseline="single-process loop (Pillow + TFRecordWriter)",
        title=f"conversion: {args.num_images} photos 500x375 -> {IMAGE_SIZE} px JPEG shards, {os.cpu_count()} cores, "
              f"median of {args.repeats}")
    print(f"chart: {chart}")
    print(json.dumps({"rates": rates, "draft_ms": draft * 1000, "full_ms": full * 1000,
                      "peak_rss_mb": {k: v / 2**20 for k, v in memory.items()}}))


if __name__ == "__main__":
    main()

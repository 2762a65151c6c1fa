"""Conversion benchmark: the Beam job against the script a competent user would write instead.

The script (SCRIPT below) is what a user times the job against: Pillow with `draft`,
`ImageOps.fit` with a bilinear resize, JPEG at the job's default quality, a `tf.train.Example`
with the same keys, `tf.io.TFRecordWriter`. It runs as a single-process loop and as a
`multiprocessing.Pool(cores)`; the job runs with its defaults. All three are timed as whole
processes (imports and start-up included), interleaved over the repeats, on the same real-photo
JPEGs (500x375), at N photos and at the README demo's 200.

It also times the per-image work alone, in this one process on bytes already in memory: the
script's function against the job's own (beam_jobs.writing.convert_shards.convert_image) with each --resample
method, and gives each one's quality: the PSNR of its 224 px output against a high-quality
reference of the same crop (full decode, Lanczos resize of the same source box).

    python benchmarks/conversion.py                  # 8000 photos, 3 repeats
    python benchmarks/conversion.py --num_images 2000 --repeats 1   # a quick look

Besides the tables it draws the end-to-end rates as a bar chart (--chart, default conversion.png
in the work dir), the single-process loop marked as the baseline; it needs matplotlib
(pip install ".[bench]").
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
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.config import ImageConfig  # noqa: E402
from beam_jobs.sample_data import make_photo_tree  # noqa: E402
from benchmarks._charts import rate_chart  # noqa: E402
from benchmarks._job_box import job_source_box  # noqa: E402

IMAGE_SIZE = 224
QUALITY = ImageConfig().jpeg_quality  # the job's default, which the script uses too
DEMO_IMAGES = 200
# The job as users run it: every default (the resampling is DEFAULT, worker processes).
DEFAULT = ImageConfig().resample_method
JOB = f"job at its defaults ({DEFAULT}, worker processes)"
JOB_IN_PROCESS = "job at its defaults, --direct_running_mode in_memory"
LOOP = "script: single-process loop"
POOL = f"script: multiprocessing.Pool({os.cpu_count()})"
GREY_LUMA = f"job --channels 1 ({DEFAULT}, the luma plane)"
GREY_PILLOW = f"job --channels 1 ({DEFAULT}, Pillow's grey: datasets made before)"
TARGETS = {"job / pool": 1.3, "job / loop": 2.0, "per image: job / script": 1.3, "demo: job / pool": 1 / 1.5}

# The script, as a user would write it (it shares no code with the job). Its per-image function
# is also timed alone, in this process (SCRIPT_FUNCTIONS).
SCRIPT_FUNCTIONS = rf"""
import io, hashlib
from PIL import Image, ImageOps
import tensorflow as tf

SIZE, QUALITY = {IMAGE_SIZE}, {QUALITY}

def to_example(data, label, label_text, filename):
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (SIZE, SIZE))
    image = ImageOps.exif_transpose(image).convert("RGB")
    image = ImageOps.fit(image, (SIZE, SIZE), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=QUALITY)
    feature = {{
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[out.getvalue()])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
        "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[SIZE])),
        "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[SIZE])),
        "image/channels": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "image/class/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[label_text.encode()])),
        "image/filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[filename.encode()])),
        "image/key/sha256": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[hashlib.sha256(data).hexdigest().encode()])),
    }}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
"""

SCRIPT = (
    SCRIPT_FUNCTIONS
    + r"""
import multiprocessing, os, pathlib, sys

def work(item):
    path, label, label_text, filename = item
    with open(path, "rb") as handle:
        return to_example(handle.read(), label, label_text, filename)

if __name__ == "__main__":
    mode, src, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    paths = sorted(src.rglob("*.jpg"))
    labels = {name: i for i, name in enumerate(sorted({p.parent.name for p in paths}))}
    items = [(str(p), labels[p.parent.name], p.parent.name, str(p.relative_to(src))) for p in paths]
    if mode == "loop":
        with tf.io.TFRecordWriter(str(out / "train-00000-of-00001.tfrecord")) as writer:
            for item in items:
                writer.write(work(item))
    else:
        num_shards = 16
        writers = [tf.io.TFRecordWriter(str(out / f"train-{i:05d}-of-{num_shards:05d}.tfrecord"))
                   for i in range(num_shards)]
        with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
            for i, record in enumerate(pool.imap(work, items, chunksize=32)):
                writers[i % num_shards].write(record)
        for writer in writers:
            writer.close()
"""
)


def _run(command: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    # As on a user's machine, imports use and write .pyc files: without them every process compiles
    # Beam (the job) and TensorFlow (the script) from source, seconds that neither side pays twice.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def end_to_end(src: pathlib.Path, work: pathlib.Path, num_images: int, repeats: int) -> dict[str, float]:
    """{name: images/s, the median over the repeats} for the job, the loop and the pool."""
    script = work / "script.py"
    script.write_text(SCRIPT)
    job = [
        sys.executable,
        "-m",
        "beam_jobs",
        "--input",
        str(src),
        "--image_size",
        str(IMAGE_SIZE),
    ]
    commands = {
        JOB: lambda out: [*job, "--output_dir", str(out)],
        JOB_IN_PROCESS: lambda out: [*job, "--output_dir", str(out), "--direct_running_mode", "in_memory"],
        LOOP: lambda out: [sys.executable, str(script), "loop", str(src), str(out)],
        POOL: lambda out: [sys.executable, str(script), "pool", str(src), str(out)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for repeat in range(repeats):
        for index, (name, command) in enumerate(commands.items()):  # interleaved: drifting load hits all alike
            out = work / f"out-{num_images}-{repeat}-{index}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            seconds[name].append(_run(command(out)))
            shutil.rmtree(out)
            print(
                f"  {num_images} photos, {name}: {num_images / seconds[name][-1]:.0f} img/s "
                f"({seconds[name][-1]:.1f} s)",
                flush=True,
            )
    return {name: num_images / statistics.median(values) for name, values in seconds.items()}


def _psnr(a, b) -> float:
    import numpy as np  # pylint: disable=import-outside-toplevel

    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def per_image(src: pathlib.Path, count: int, repeats: int) -> dict[str, tuple[float, float]]:
    """{path: (median ms per image, mean PSNR in dB against the Lanczos reference of its crop)}."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from PIL import Image, ImageOps  # pylint: disable=import-outside-toplevel

    from beam_jobs.imaging.resample import RESAMPLE_METHODS  # pylint: disable=import-outside-toplevel
    from beam_jobs.records import InputFile  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.convert_shards import convert_image  # pylint: disable=import-outside-toplevel

    paths = sorted(src.rglob("*.jpg"))[:count]
    blobs = [p.read_bytes() for p in paths]
    namespace: dict = {}
    exec(compile(SCRIPT_FUNCTIONS, "script", "exec"), namespace)  # pylint: disable=exec-used
    script = namespace["to_example"]
    inputs = [InputFile(p.name, str(p), label=p.parent.name, label_id=0) for p in paths]
    paths_under_test = {"script (draft, ImageOps.fit bilinear)": lambda data, f: script(data, 0, f.label, f.filename)}
    for method in RESAMPLE_METHODS:
        config = ImageConfig(width=IMAGE_SIZE, height=IMAGE_SIZE, resample=method)
        paths_under_test[f"job --resample {method}" + (" (default)" if method == DEFAULT else "")] = (
            lambda data, f, config=config: convert_image(data, f, config)[0]
        )
    # Grey at the default resampling: the luma plane on the array path, and Pillow's decode and
    # "L" conversion, which grey datasets made before the luma plane keep. Scored in grey.
    for grey, decode in ((GREY_LUMA, "luma"), (GREY_PILLOW, "pillow")):
        config = ImageConfig(width=IMAGE_SIZE, height=IMAGE_SIZE, channels=1, grey_decode=decode)
        paths_under_test[grey] = lambda data, f, config=config: convert_image(data, f, config)[0]
    timings: dict[str, list[float]] = {name: [] for name in paths_under_test}
    for _ in range(repeats):
        for name, run in paths_under_test.items():
            start = time.perf_counter()
            for data, input_file in zip(blobs, inputs, strict=True):
                run(data, input_file)
            timings[name].append((time.perf_counter() - start) / len(blobs) * 1000)

    def pixels(record: bytes):
        example = tf.train.Example.FromString(record)
        encoded = example.features.feature["image/encoded"].bytes_list.value[0]
        return Image.open(io.BytesIO(encoded)).convert("RGB")

    def reference(data: bytes, method: str | None):
        image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
        if method is None:  # the script: ImageOps.fit's own box, at full resolution
            return ImageOps.fit(image, (IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
        box = job_source_box(data, method, IMAGE_SIZE)
        return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS, box=box)

    quality_sample = list(zip(blobs, inputs, strict=True))[:60]
    results = {}
    for name, run in paths_under_test.items():
        method = name.split("--resample ")[1].split()[0] if "--resample" in name else None
        if name in (GREY_LUMA, GREY_PILLOW):
            psnr = statistics.mean(
                _psnr(pixels(run(data, f)).convert("L"), reference(data, DEFAULT).convert("L"))
                for data, f in quality_sample
            )
        else:
            psnr = statistics.mean(_psnr(pixels(run(data, f)), reference(data, method)) for data, f in quality_sample)
        results[name] = (statistics.median(timings[name]), psnr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per_image_count", type=int, default=400, help="photos in the per-image timing")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument(
        "--chart",
        type=pathlib.Path,
        default=None,
        help="bar chart PNG of the end-to-end rates [WORK_DIR/conversion.png]",
    )
    args = parser.parse_args()
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="conversion-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {}
    for n in (args.num_images, DEMO_IMAGES):
        trees[n] = work / f"photos-{n}"
        if not trees[n].exists():
            print(f"making {n} real-photo JPEGs (500x375) in {trees[n]}", flush=True)
            make_photo_tree(trees[n], num_images=n, size=(500, 375), seed=0)
    print(f"{os.cpu_count()} cores; {args.repeats} repeats; JPEG quality {QUALITY} everywhere", flush=True)
    single = per_image(trees[args.num_images], args.per_image_count, args.repeats)
    rates = end_to_end(trees[args.num_images], work, args.num_images, args.repeats)
    demo = end_to_end(trees[DEMO_IMAGES], work, DEMO_IMAGES, args.repeats)

    job, loop, pool = rates[JOB], rates[LOOP], rates[POOL]
    demo_job, demo_pool = demo[JOB], demo[POOL]
    script_ms, script_psnr = next(iter(single.values()))
    default_name = next(name for name in single if "(default)" in name)
    default_ms, default_psnr = single[default_name]
    print()
    print(
        f"| per image, one process, {args.per_image_count} photos 500x375 -> {IMAGE_SIZE} px | ms | "
        "script / this | PSNR vs Lanczos (dB) |"
    )
    print("|---|---:|---:|---:|")
    for name, (ms, psnr) in single.items():
        print(f"| {name} | {ms:.2f} | {script_ms / ms:.2f}x | {psnr:.1f} |")
    print()
    print(f"| end to end, {args.num_images} photos, median of {args.repeats} | images/s | job / this |")
    print("|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.0f} | {job / rate:.2f}x |")
    print()
    print(f"| end to end, {DEMO_IMAGES} photos (the README demo), median of {args.repeats} | images/s | job / this |")
    print("|---|---:|---:|")
    for name, rate in demo.items():
        print(f"| {name} | {rate:.0f} | {demo_job / rate:.2f}x |")
    measured = {
        "job / pool": job / pool,
        "job / loop": job / loop,
        "per image: job / script": script_ms / default_ms,
        "demo: job / pool": demo_job / demo_pool,
    }
    print()
    print("| target | measured | at least | met |")
    print("|---|---:|---:|:-:|")
    for name, value in measured.items():
        print(f"| {name} | {value:.2f}x | {TARGETS[name]:.1f}x | {'yes' if value >= TARGETS[name] else 'NO'} |")
    print(
        f"| PSNR: {DEFAULT} / script | {default_psnr:.1f} / {script_psnr:.1f} dB | equal | "
        f"{'yes' if default_psnr >= script_psnr else 'NO'} |"
    )
    chart = rate_chart(
        rates,
        args.chart or work / "conversion.png",
        baseline=LOOP,
        title=f"conversion: {args.num_images} photos 500x375 -> {IMAGE_SIZE} px JPEG shards, {os.cpu_count()} cores, "
        f"median of {args.repeats}",
    )
    print(f"chart: {chart}")
    print(json.dumps({"per_image": single, "rates": rates, "demo_rates": demo, "measured": measured}))


if __name__ == "__main__":
    main()

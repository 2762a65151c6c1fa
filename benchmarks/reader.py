"""Benchmark: images/sec of this reader vs the seed article's four pipelines and a decode-only limit.

Usage: python benchmarks/reader.py [--work_dir DIR] [--num_images 2000] [--rounds 3] [--repeats 2] [--seconds 3]

All pipelines read the same >= 2000 real-photo JPEGs (about 500x375, made by
beam_jobs.sample_data) and yield float32 [32, 224, 224, 3] batches (the decode-only limit and the
reader's dtype="uint8" row yield uint8). The reader's shards come from the conversion job's CLI
(`python -m beam_jobs`). Each figure is the median of several repeats; every measurement runs in a
fresh process, round-robin over the pipelines, after a warm-up long enough for tf.data's autotuner
to settle (the reader's rate still rose for several seconds after 5 warm-up batches).

JPEG is decoded with Pillow's IDCT ("INTEGER_ACCURATE", the reader's default) in every row but those
named INTEGER_FAST (TensorFlow's own default). What Pillow's pixels cost, as the accurate / fast
ratios of one run, printed at the end:
  --only "JPEG eval (auto,JPEG training (crop+flip), seed: deterministic,INTEGER_FAST"

Besides the table it draws the medians as a bar chart (--chart, default reader.png in the work
dir), the from_generator baseline and the decode-only limit marked; it needs matplotlib
(pip install ".[bench]").
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
from collections.abc import Callable, Iterator

import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import _article_baselines as article  # noqa: E402
from _charts import rate_chart  # noqa: E402

import tfdata_readers  # noqa: E402
from tfdata_readers.decoding.decode import to_float  # noqa: E402

BATCH = article.BATCH_SIZE
SIZE = article.IMAGE_SIZE


def _source_photos(src: pathlib.Path, num_images: int) -> list[pathlib.Path]:
    from beam_jobs.sample_data import make_photo_tree

    existing = sorted(src.glob("*/*.jpg"))
    if len(existing) == num_images:
        return existing
    return sorted(make_photo_tree(src, num_images=num_images, size=(500, 375), seed=0))


def _convert_with_beam(src: pathlib.Path, out: pathlib.Path, encoding: str, num_shards: int) -> None:
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
            encoding,
            "--num_shards",
            str(num_shards),
        ],
        check=True,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )


def _largest_split(data_dir: pathlib.Path) -> str:
    info = tfdata_readers.load_manifest(data_dir)
    return max(info.splits, key=lambda name: info.splits[name].num_examples)


def _jpeg_bytes(jpeg_dir: pathlib.Path) -> tf.Tensor:
    """The JPEG bytes of every image in the shards, as one in-memory [N] string tensor."""
    split = tfdata_readers.load_manifest(jpeg_dir).split(_largest_split(jpeg_dir))
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    return tf.constant(
        [
            tf.io.parse_single_example(r, spec)["image/encoded"].numpy()
            for s in split.shards
            for r in tf.data.TFRecordDataset(s.path)
        ]
    )


def _decode_only(encoded: tf.Tensor, dct_method: str = "INTEGER_ACCURATE") -> tf.data.Dataset:
    """The machine's JPEG decode limit: the shards' JPEG bytes, already in memory, decoded in a
    parallel map and batched as uint8. No reading, parsing, casting or scaling."""
    return (
        tf.data.Dataset.from_tensor_slices(encoded)
        .repeat()
        .map(
            lambda e: (tf.io.decode_jpeg(e, channels=3, dct_method=dct_method),),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )


def _decode_to_float(encoded: tf.Tensor) -> tf.data.Dataset:
    """The decode-only limit plus the float32 [0, 1] conversion every other row pays for."""
    return _decode_only(encoded).map(
        lambda x: (to_float(x, 1.0 / 255.0),), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False
    )


def _measure(iterator: Iterator, seconds: float) -> float:
    images, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        images += int(next(iterator)[0].shape[0])
    return images / elapsed


def _methods(ctx: dict) -> dict[str, Callable[[], tf.data.Dataset]]:
    """Every measured pipeline by name, each yielding (float32 [32, 224, 224, 3], label) forever."""
    paths, labels = ctx["paths"], ctx["labels"]
    jpeg, raw, method4_dir = pathlib.Path(ctx["jpeg"]), pathlib.Path(ctx["raw"]), pathlib.Path(ctx["method4"])
    jpeg_split, raw_split = _largest_split(jpeg), _largest_split(raw)

    def reader(data_dir: pathlib.Path, split: str, **options) -> Callable[[], tf.data.Dataset]:
        return lambda: tfdata_readers.make_dataset(data_dir, split, BATCH, **options).repeat()

    return {
        "article: problem (from_generator + Pillow)": lambda: article.problem_from_generator(paths, labels).repeat(),
        "article: Method 1 (interleaved generators)*": lambda: article.method1_interleave_generators(
            paths, labels
        ).repeat(),
        "article: Method 2 (path generator + map)": lambda: article.method2_paths_then_map(paths, labels).repeat(),
        "article: Method 4 (float-list TFRecords)": lambda: article.method4_float_tfrecords(method4_dir).repeat(),
        "decode-only limit (in-memory JPEG bytes)": lambda: _decode_only(_jpeg_bytes(jpeg)),
        "decode-only limit, INTEGER_FAST (in-memory)": lambda: _decode_only(_jpeg_bytes(jpeg), "INTEGER_FAST"),
        "decode-only + float32 conversion (in-memory)": lambda: _decode_to_float(_jpeg_bytes(jpeg)),
        "reader JPEG eval (auto: decode per batch)": reader(jpeg, jpeg_split),
        "reader JPEG eval, decode per element": reader(jpeg, jpeg_split, decode_placement="element"),
        "reader JPEG eval, dtype=uint8 (scale on device)": reader(jpeg, jpeg_split, dtype="uint8"),
        "reader JPEG eval, INTEGER_FAST": reader(jpeg, jpeg_split, jpeg_dct_method="INTEGER_FAST"),
        # A seed makes the reader deterministic by default (ReadConfig.deterministic=None); the
        # deterministic=False rows measure what that costs.
        "reader JPEG training (crop+flip), seed: deterministic": reader(jpeg, jpeg_split, training=True, seed=0),
        "reader JPEG training (crop+flip), seed, deterministic=False": reader(
            jpeg, jpeg_split, training=True, seed=0, deterministic=False
        ),
        "reader JPEG training (crop+flip), seed: deterministic, INTEGER_FAST": reader(
            jpeg, jpeg_split, training=True, seed=0, jpeg_dct_method="INTEGER_FAST"
        ),
        "reader RAW eval (auto: decode per batch)": reader(raw, raw_split),
        "reader RAW eval, decode per element": reader(raw, raw_split, decode_placement="element"),
        "reader RAW training (crop+flip), seed: deterministic": reader(raw, raw_split, training=True, seed=0),
        "reader RAW training (crop+flip), seed, deterministic=False": reader(
            raw, raw_split, training=True, seed=0, deterministic=False
        ),
    }


def _measure_in_this_process(ctx: dict, name: str, *, repeats: int, seconds: float, warmup_s: float) -> list[float]:
    iterator = iter(_methods(ctx)[name]())
    # The first batch is checked: a later one may be an evaluation epoch's partial last batch
    # (the split's size need not be a multiple of the batch), which is no fault of the pipeline.
    batch = next(iterator)
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        next(iterator)
    uint8_row = "limit" in name or "uint8" in name
    if tuple(batch[0].shape) != (BATCH, SIZE, SIZE, 3) or batch[0].dtype != (tf.uint8 if uint8_row else tf.float32):
        raise RuntimeError(f"{name} yields {batch[0].dtype} {batch[0].shape}; expected [32, 224, 224, 3]")
    return [_measure(iterator, seconds) for _ in range(repeats)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", type=pathlib.Path, default=pathlib.Path("/tmp/tfdata_readers_bench"))
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--num_shards", type=int, default=16)
    parser.add_argument(
        "--method4_images",
        type=int,
        default=500,
        help="images written for Method 4 (its float lists take 600 KB an image, written at ~30/s)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="processes per pipeline, run round-robin")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats in each process")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one timed repeat")
    parser.add_argument("--warmup_s", type=float, default=5.0, help="seconds each pipeline runs before timing")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures here")
    parser.add_argument("--chart", type=pathlib.Path, help="bar chart PNG of the medians [WORK_DIR/reader.png]")
    parser.add_argument(
        "--only",
        help="comma-separated substrings: measure only the matching pipelines "
        "(the problem pipeline and decode-only limit are always kept for the ratios)",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one pipeline, in a child process
    args = parser.parse_args(argv)

    work = args.work_dir
    context_file = work / f"context_{args.num_images}.json"
    if args.measure:
        ctx = json.loads(context_file.read_text())
        rates = _measure_in_this_process(
            ctx, args.measure, repeats=args.repeats, seconds=args.seconds, warmup_s=args.warmup_s
        )
        print("RATES " + json.dumps(rates))
        return

    photos = _source_photos(work / "photos", args.num_images)
    labels_by_name = {name: i for i, name in enumerate(sorted({p.parent.name for p in photos}))}
    paths = [str(p) for p in photos]
    labels = [labels_by_name[p.parent.name] for p in photos]
    converter = "python -m beam_jobs"
    shard_dirs = {}
    for encoding in ("jpeg", "raw"):
        out = work / f"shards_{encoding}_beam_{args.num_images}"
        if not (out / "dataset_info.json").exists():
            _convert_with_beam(work / "photos", out, encoding, args.num_shards)
        shard_dirs[encoding] = str(out)
    method4_dir = work / f"method4_{args.method4_images}"
    if not (method4_dir / "data_shard_3.tfrecord").exists():
        rate = article.write_method4_float_tfrecords(
            paths[: args.method4_images], labels[: args.method4_images], method4_dir
        )
        print(f"Method 4 wrote {args.method4_images} float-list records at {rate:.0f} img/s")
    ctx = {"paths": paths, "labels": labels, "method4": str(method4_dir), **shard_dirs}
    context_file.write_text(json.dumps(ctx))

    names = list(_methods(ctx))
    if args.only:
        keep = [p.strip() for p in args.only.split(",")] + ["problem", "decode-only"]
        names = [name for name in names if any(k in name for k in keep)]
    rates: dict[str, list[float]] = {name: [] for name in names}
    # One process per measurement, round-robin: a pipeline's leftovers (the article's generator
    # threads keep running after their iterator is dropped) must not slow the next one down, and
    # background load then hits every pipeline alike.
    for _ in range(args.rounds):
        for name in names:
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--measure",
                    name,
                    "--work_dir",
                    str(work),
                    "--num_images",
                    str(args.num_images),
                    "--repeats",
                    str(args.repeats),
                    "--seconds",
                    str(args.seconds),
                    "--warmup_s",
                    str(args.warmup_s),
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
            lines = [line for line in child.stdout.splitlines() if line.startswith("RATES ")]
            if child.returncode != 0 or not lines:
                raise RuntimeError(f"measuring {name!r} failed:\n{child.stderr[-3000:]}")
            rates[name] += json.loads(lines[-1][len("RATES ") :])
    medians = {name: statistics.median(r) for name, r in rates.items()}

    problem = medians["article: problem (from_generator + Pillow)"]
    limit = medians["decode-only limit (in-memory JPEG bytes)"]
    print(
        f"\n{len(photos)} source photos (500x375 JPEG), batches of {BATCH} x {SIZE}x{SIZE}x3 float32, "
        f"{os.cpu_count()} cores; shards by {converter}; median of {args.rounds} processes x "
        f"{args.repeats} repeats x {args.seconds:g} s"
    )
    print(f"{'pipeline':50s} {'img/s':>8s} {'min-max':>13s} {'x problem':>10s} {'/ decode limit':>15s}")
    for name, median in medians.items():
        spread = f"{min(rates[name]):.0f}-{max(rates[name]):.0f}"
        print(f"{name:50s} {median:8.0f} {spread:>13s} {median / problem:9.1f}x {median / limit:14.0%}")
    print(
        "* Method 1 as printed calls shard_id.numpy() inside interleave, which fails; the shard id is "
        "passed with from_generator(args=...) instead, as the article intends."
    )
    print(
        "  The decode-only limit and the dtype=uint8 row yield uint8 batches; all other rows yield float32 in [0, 1]."
    )
    chart = rate_chart(
        medians,
        args.chart or work / "reader.png",
        baseline="article: problem (from_generator + Pillow)",
        limit="decode-only limit (in-memory JPEG bytes)",
        title=f"reading {len(photos)} photos as batches of {BATCH} x {SIZE}x{SIZE}x3, {os.cpu_count()} cores, "
        f"median of {args.rounds} processes x {args.repeats} repeats",
    )
    print(f"chart: {chart}")
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "rates": rates, "converter": converter}, indent=2))
    _print_determinism_cost(medians, rates)
    _print_dct_cost(medians)
    jpeg_name, raw_name = "reader JPEG eval (auto: decode per batch)", "reader RAW eval (auto: decode per batch)"
    if jpeg_name not in medians or raw_name not in medians:
        return
    jpeg_rate, raw_rate = medians[jpeg_name], medians[raw_name]
    print("\ntargets:")
    print(
        f"  reader JPEG >= 12x problem:        {jpeg_rate / problem:5.1f}x  "
        f"{'OK' if jpeg_rate >= 12 * problem else 'MISSED'}"
    )
    print(
        f"  reader JPEG >= 90% decode limit:   {jpeg_rate / limit:5.0%}   "
        f"{'OK' if jpeg_rate >= 0.9 * limit else 'MISSED'}"
    )
    with_float = medians.get("decode-only + float32 conversion (in-memory)")
    if with_float:
        print(f"  (reader JPEG / decode + float32 limit: {jpeg_rate / with_float:5.0%})")
    uint8_rate = medians.get("reader JPEG eval, dtype=uint8 (scale on device)")
    if uint8_rate:
        print(
            f"  (reader JPEG dtype=uint8 / decode limit: {uint8_rate / limit:5.0%}  "
            f"{'OK' if uint8_rate >= 0.9 * limit else 'MISSED'})"
        )
    print(
        f"  reader RAW  >= 25x problem:        {raw_rate / problem:5.1f}x  "
        f"{'OK' if raw_rate >= 25 * problem else 'MISSED'}"
    )


def _print_determinism_cost(medians: dict[str, float], rates: dict[str, list[float]]) -> None:
    """What a seeded run's default (deterministic order) costs against deterministic=False."""
    for fmt in ("JPEG", "RAW"):
        seeded = f"reader {fmt} training (crop+flip), seed: deterministic"
        free = f"reader {fmt} training (crop+flip), seed, deterministic=False"
        if seeded in medians and free in medians:
            print(
                f"  {fmt} training, deterministic / deterministic=False: {medians[seeded] / medians[free]:.2f} "
                f"(medians {medians[seeded]:.0f} / {medians[free]:.0f} img/s)"
            )


# (the accurate row, its INTEGER_FAST twin): what Pillow's pixels cost on each path.
_DCT_PAIRS = (
    ("decode-only limit (in-memory JPEG bytes)", "decode-only limit, INTEGER_FAST (in-memory)"),
    ("reader JPEG eval (auto: decode per batch)", "reader JPEG eval, INTEGER_FAST"),
    (
        "reader JPEG training (crop+flip), seed: deterministic",
        "reader JPEG training (crop+flip), seed: deterministic, INTEGER_FAST",
    ),
)


def _print_dct_cost(medians: dict[str, float]) -> None:
    """Each path's throughput with Pillow's IDCT (the default) against TensorFlow's fast one."""
    for accurate, fast in _DCT_PAIRS:
        if accurate in medians and fast in medians:
            print(
                f"  {accurate}: INTEGER_ACCURATE / INTEGER_FAST {medians[accurate] / medians[fast]:.3f} "
                f"(medians {medians[accurate]:.0f} / {medians[fast]:.0f} img/s)"
            )


if __name__ == "__main__":
    main()

"""Peers benchmark: the Beam job against the tools a user would pick instead, each as a whole process.

Every contender does the same conversion: N real-photo JPEGs (500x375) in a class-per-folder tree
into labelled records holding a 224x224 centre crop at JPEG quality 95 (the job's default), on the
same cores (all of this machine's), each in the fast form its own documentation shows:

- ``job``: ``python -m beam_jobs --input SRC --output_dir OUT --image_size 224``, the job's defaults
  (``--resample dct_sinc``, worker processes on every core);
- ``pool``: the Pillow script of benchmarks/conversion.py (``ImageOps.fit`` bilinear,
  ``tf.train.Example``, ``tf.io.TFRecordWriter``) in a ``multiprocessing.Pool(cores)``;
  ``pool_bicubic``: the same script with a bicubic ``ImageOps.fit``, the quality of the job's;
- ``ray``: Ray Data, ``read_binary_files(include_paths=True)``, ``map_batches`` (decode,
  ``ImageOps.fit``, encode with Pillow) and ``write_tfrecords``, on ``ray.init(num_cpus=cores)``;
- ``litdata``: ``litdata.optimize`` with ``num_workers=cores`` into its own chunk format, each
  image returned as ``litdata.Image(image=..., quality=95, format="jpeg")`` (its README's
  "Optimize images as JPEG");
- ``daft``: Daft's own image expressions (``from_glob_path``, ``download``, ``decode_image``,
  ``crop``, ``resize``, ``encode_image("JPEG")``) written to parquet; Daft has no centre crop, so
  the box is a whole-pixel square from the image's width and height, and no JPEG quality setting.

Each is timed as a whole process (imports and start-up included), the order rotated between
repeats so drifting load hits all alike. After each run its output is read back by a reader of
its format (TensorFlow's for TFRecords, LitData's ``StreamingDataset``, pyarrow for parquet): the
record count must be N, and a sample of its images is decoded and scored as the other benchmarks
score quality: PSNR against a Lanczos resize of the full decode over the box that contender
cropped; the table also gives the JPEG quality its quantization tables show.

The peers are installed by this script, each into its own virtual environment under
--peers_venv (never the project's), at the pinned versions of PEER_PACKAGES, with the project's
Pillow so that the per-image work of the Pillow-based peers is the pool's; a stamp file keeps a
second run from installing again. Separate environments because Daft imports TensorFlow and
torch whenever they are installed (to check its literals' types), seconds a Daft-only user never
pays. The environments take some 8 GB of disk (LitData pulls CUDA torch, Ray's TFRecord writer TensorFlow).

    python benchmarks/peers.py                                    # 8000 photos, 3 repeats
    python benchmarks/peers.py --num_images 300 --repeats 1       # a quick look
    python benchmarks/peers.py --only job,pool,pool_bicubic       # no peer installed
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import importlib.metadata
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
from benchmarks._job_box import job_source_box  # noqa: E402
from benchmarks.conversion import SCRIPT  # noqa: E402

IMAGE_SIZE = 224
QUALITY = ImageConfig().jpeg_quality  # the job's default, which every peer is asked for too
DEFAULT_METHOD = ImageConfig().resample_method
CORES = os.cpu_count() or 1
QUALITY_SAMPLE = 60  # images per contender decoded and scored
DEFAULT_PEERS_VENV = pathlib.Path.home() / ".cache" / "images-to-tfrecords" / "peers-venv"
PILLOW = f"pillow=={importlib.metadata.version('pillow')}"
# Pinned so that a run measures what was checked to work; bump them together with the scripts below.
PEER_PACKAGES = {
    # write_tfrecords builds each tf.train.Example with TensorFlow and frames it with crc32c.
    "ray": ("ray[data]==2.60.0", "tensorflow-cpu==2.21.0", "crc32c==2.9.post0", PILLOW),
    "litdata": ("litdata==0.2.76", PILLOW),
    "daft": ("daft==0.7.26",),  # its image work is its own (Rust); pyarrow comes with it
}
# The peers' telemetry, off: no contender should wait on a network it may not reach.
PEER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "DAFT_ANALYTICS_ENABLED": "0", "DO_NOT_TRACK": "1"}

BICUBIC_SCRIPT = SCRIPT.replace("Image.Resampling.BILINEAR", "Image.Resampling.BICUBIC")
assert BICUBIC_SCRIPT != SCRIPT, "benchmarks/conversion.py's SCRIPT no longer resizes with BILINEAR"

# The per-image work of the Pillow-based peers: the idiomatic decode and ImageOps.fit (bicubic, its
# default) that a user writes inside a framework's map function.
PEER_FIT = rf"""
import io, os, pathlib, sys
from PIL import Image, ImageOps

SIZE, QUALITY = {IMAGE_SIZE}, {QUALITY}

def fit(data):
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    return ImageOps.fit(image, (SIZE, SIZE))
"""

RAY_SCRIPT = (
    PEER_FIT
    + r"""
import numpy as np
import ray

def convert(batch, root, classes):
    encoded, names = [], []
    for data, path in zip(batch["bytes"], batch["path"]):
        out = io.BytesIO()
        fit(data).save(out, "JPEG", quality=QUALITY)
        encoded.append(out.getvalue())
        names.append(os.path.relpath(path, root))
    texts = [name.split("/")[0] for name in names]
    return {
        "image/encoded": np.array(encoded, dtype=object),
        "image/class/label": np.array([classes[text] for text in texts], dtype=np.int64),
        "image/class/text": np.array(texts, dtype=object),
        "image/filename": np.array(names, dtype=object),
    }

if __name__ == "__main__":
    src, out, cores = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2], int(sys.argv[3])
    classes = {name: i for i, name in enumerate(sorted(p.name for p in src.iterdir() if p.is_dir()))}
    ray.init(num_cpus=cores)
    dataset = ray.data.read_binary_files(str(src), include_paths=True)
    dataset = dataset.map_batches(convert, fn_kwargs={"root": str(src), "classes": classes})
    dataset.write_tfrecords(out)
"""
)

LITDATA_SCRIPT = (
    PEER_FIT
    + r"""
import litdata as ld

def convert(item):
    path, label, text, name = item
    with open(path, "rb") as handle:
        image = fit(handle.read())
    return {"image": ld.Image(image=image, quality=QUALITY, format="jpeg"), "label": label, "text": text,
            "filename": name}

if __name__ == "__main__":
    src, out, cores = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2], int(sys.argv[3])
    paths = sorted(src.rglob("*.jpg"))
    classes = {name: i for i, name in enumerate(sorted({p.parent.name for p in paths}))}
    items = [(str(p), classes[p.parent.name], p.parent.name, str(p.relative_to(src))) for p in paths]
    ld.optimize(fn=convert, inputs=items, output_dir=out, num_workers=cores, chunk_bytes="64MB")
"""
)

DAFT_SCRIPT = rf"""
import pathlib, sys
import daft
from daft import col
from daft.functions import image_height, image_width, to_list, when

SIZE = {IMAGE_SIZE}

if __name__ == "__main__":
    src, out = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2]
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    labels = daft.from_pydict({{"image/class/text": classes, "image/class/label": list(range(len(classes)))}})
    df = daft.from_glob_path(f"{{src}}/**/*.jpg")
    df = df.with_column("image", col("path").download().decode_image(mode="RGB"))
    width, height = image_width(col("image")), image_height(col("image"))
    side = when(width < height, width).otherwise(height)
    box = to_list((width - side) // 2, (height - side) // 2, side, side)
    df = df.with_columns({{
        "image/encoded": col("image").crop(box).resize(SIZE, SIZE).encode_image("JPEG"),
        "image/filename": col("path").regexp_extract(r"([^/]+/[^/]+)$", 1),
        "image/class/text": col("path").regexp_extract(r"([^/]+)/[^/]+$", 1),
    }})
    df = df.join(labels, on="image/class/text")
    df.select("image/encoded", "image/class/label", "image/class/text", "image/filename").write_parquet(out)
"""

# Readers: each reads back every record a contender wrote, with its format's own library, and
# returns the count and the stored image bytes of the sample. argv: request JSON, result JSON.
READER_START = r"""
import base64, json, pathlib, sys
request = json.loads(pathlib.Path(sys.argv[1]).read_text())
out, wanted = pathlib.Path(request["out"]), set(request["wanted"])
count, sample = 0, {}

def keep(name, data):
    if name in wanted:
        sample[name] = base64.b64encode(bytes(data)).decode()
"""
READER_END = r"""
pathlib.Path(sys.argv[2]).write_text(json.dumps({"count": count, "sample": sample}))
"""
READERS = {
    "tfrecord": r"""
import tensorflow as tf
files = sorted(str(p) for p in out.glob(request["files"]) if p.is_file() and not p.name.startswith("."))
for record in tf.data.TFRecordDataset(files):  # checks each record's CRCs
    feature = tf.train.Example.FromString(record.numpy()).features.feature
    count += 1
    keep(feature["image/filename"].bytes_list.value[0].decode(), feature["image/encoded"].bytes_list.value[0])
""",
    "litdata": r"""
import litdata as ld
from litdata.streaming.serializers import ImageSerializer

class StoredBytes(ImageSerializer):
    def deserialize(self, data):  # the JPEG as stored, not LitData's decoded tensor
        return data

for item in ld.StreamingDataset(str(out), serializers={"image": StoredBytes()}):
    count += 1
    keep(item["filename"], item["image"])
""",
    "parquet": r"""
import pyarrow.parquet as pq
table = pq.read_table(out, columns=["image/filename", "image/encoded"])
count = table.num_rows
for name, data in zip(table.column("image/filename").to_pylist(), table.column("image/encoded").to_pylist()):
    keep(name, data)
""",
}


@dataclasses.dataclass(frozen=True)
class Contender:
    """One way of doing the conversion, and how to read back and score what it wrote."""

    label: str
    venv: str | None  # the peer environment it runs in; None: the project's interpreter
    script: str | None  # the conversion run as `python SCRIPT_FILE [mode] SRC OUT CORES`; None: the job
    mode: tuple[str, ...]  # arguments before SRC (conversion.py's script takes its mode first)
    reader: str  # a key of READERS
    files: str  # the glob, under OUT, of its TFRecord files (tfrecord reader only)
    box: str  # its crop's source box: "job" (benchmarks/_job_box.py), "whole" (pixels) or "fit" (ImageOps.fit's)


CONTENDERS = {
    "job": Contender(
        f"job (defaults: {DEFAULT_METHOD}, worker processes)", None, None, (), "tfrecord", "shards/*/*.tfrecord", "job"
    ),
    "pool": Contender(f"script: Pool({CORES}), fit bilinear", None, SCRIPT, ("pool",), "tfrecord", "*", "fit"),
    "pool_bicubic": Contender(
        f"script: Pool({CORES}), fit bicubic", None, BICUBIC_SCRIPT, ("pool",), "tfrecord", "*", "fit"
    ),
    "ray": Contender("Ray Data: map_batches + write_tfrecords", "ray", RAY_SCRIPT, (), "tfrecord", "*", "fit"),
    "litdata": Contender("LitData: optimize (own chunks)", "litdata", LITDATA_SCRIPT, (), "litdata", "", "fit"),
    "daft": Contender("Daft: image expressions -> parquet", "daft", DAFT_SCRIPT, (), "parquet", "", "whole"),
}


def ensure_venv(root: pathlib.Path, name: str) -> pathlib.Path:
    """The python of peer ``name``'s own environment under ``root``, installed first unless its stamp
    says that these very pins are there (a second run installs nothing)."""
    venv, packages = root / name, PEER_PACKAGES[name]
    python, stamp = venv / "bin" / "python", venv / "peers-installed.txt"
    if python.exists() and stamp.is_file() and stamp.read_text(encoding="utf-8").split() == list(packages):
        return python
    print(f"installing {name} into {venv}: {' '.join(packages)}", flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    stamp.write_text("\n".join(packages) + "\n", encoding="utf-8")
    print(f"  installed {name} in {time.perf_counter() - start:.0f} s", flush=True)
    return python


def _env(peer: bool) -> dict[str, str]:
    """The environment of a timed or reading process: the job and the script import this checkout;
    a peer imports only its own environment's packages."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # As on a user's machine, imports use and write .pyc files (see benchmarks/conversion.py).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if peer:
        env.pop("PYTHONPATH", None)
        env.update(PEER_ENV)
    else:
        env["PYTHONPATH"] = str(REPO)
    return env


def _run(command: list[str], peer: bool) -> float:
    """Seconds ``command`` took as a whole process; a failure ends the benchmark with its stderr."""
    start = time.perf_counter()
    proc = subprocess.run(
        command, cwd=REPO, env=_env(peer), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def _command(name: str, python: str, work: pathlib.Path, src: pathlib.Path, out: pathlib.Path) -> list[str]:
    """The argv that converts ``src`` into ``out``: the job's CLI at its defaults, or the contender's
    script saved under ``work``."""
    contender = CONTENDERS[name]
    if contender.script is None:
        return [
            python,
            "-m",
            "beam_jobs",
            "--input",
            str(src),
            "--output_dir",
            str(out),
            "--image_size",
            str(IMAGE_SIZE),
        ]
    script = work / f"convert-{name}.py"
    script.write_text(contender.script, encoding="utf-8")
    return [python, str(script), *contender.mode, str(src), str(out), str(CORES)]


def read_back(contender: Contender, python: str, work: pathlib.Path, out: pathlib.Path, wanted: list[str]):
    """(record count, {filename: stored image bytes} of the ``wanted`` sample) of what ``contender``
    wrote to ``out``, read by its format's own reader in its own environment."""
    request, result = work / "read-request.json", work / "read-result.json"
    request.write_text(json.dumps({"out": str(out), "files": contender.files, "wanted": wanted}), encoding="utf-8")
    reader = work / f"reader-{contender.reader}.py"
    reader.write_text(READER_START + READERS[contender.reader] + READER_END, encoding="utf-8")
    proc = subprocess.run(
        [python, str(reader), str(request), str(result)],
        env=_env(contender.venv is not None),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"reading back {contender.label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    answer = json.loads(result.read_text(encoding="utf-8"))
    return answer["count"], {name: base64.b64decode(data) for name, data in answer["sample"].items()}


def _psnr(a, b) -> float:
    import numpy as np  # pylint: disable=import-outside-toplevel

    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@functools.cache
def _reference(path: pathlib.Path, box: str):
    """The Lanczos resize of the full decode of ``path`` over the box a contender crops."""
    from PIL import Image, ImageOps  # pylint: disable=import-outside-toplevel

    from beam_jobs.imaging.geometry import _centre_box  # pylint: disable=import-outside-toplevel,protected-access

    image = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    if box == "fit":  # ImageOps.fit's own box, at full resolution
        return ImageOps.fit(image, (IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    if box == "job":
        return image.resize(
            (IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS, box=job_source_box(path.read_bytes(), DEFAULT_METHOD)
        )
    crop = _centre_box(image.size, (IMAGE_SIZE, IMAGE_SIZE), whole_pixels=box == "whole")
    return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS, box=crop)


@functools.cache
def _quality_tables() -> dict[int, list[int]]:
    """{quality: luma quantization table} of libjpeg's standard tables, as Pillow writes them."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    tables = {}
    for quality in range(1, 101):
        out = io.BytesIO()
        Image.new("RGB", (8, 8)).save(out, "JPEG", quality=quality)
        tables[quality] = list(Image.open(out).quantization[0])
    return tables


def jpeg_quality(data: bytes) -> int:
    """The standard quality whose luma table is nearest the one ``data`` was encoded with: what
    quality a contender really wrote, whatever it was asked for."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    table = list(Image.open(io.BytesIO(data)).quantization[0])
    return min(
        _quality_tables().items(), key=lambda item: sum(abs(a - b) for a, b in zip(item[1], table, strict=True))
    )[0]


def score(src: pathlib.Path, contender: Contender, sample: dict[str, bytes]) -> tuple[float, int]:
    """(mean PSNR in dB against the Lanczos reference of its box, JPEG quality) over the sample."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    psnr = statistics.mean(
        _psnr(Image.open(io.BytesIO(data)).convert("RGB"), _reference(src / name, contender.box))
        for name, data in sorted(sample.items())
    )
    return psnr, statistics.mode(jpeg_quality(data) for data in sample.values())


def end_to_end(src, work, pythons, names, num_images, repeats):
    """{name: {"seconds": [...], "counts": [...], "psnr": dB, "quality": q, "sample_missing": n}}, each
    contender run once per repeat in an order rotated by one each repeat, its output read back."""
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*.jpg"))
    wanted = files[:: max(1, len(files) // QUALITY_SAMPLE)][:QUALITY_SAMPLE]
    results = {name: {"seconds": [], "counts": []} for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            contender, python, result = CONTENDERS[name], pythons[name], results[name]
            out = work / f"out-{name}-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            result["seconds"].append(_run(_command(name, python, work, src, out), contender.venv is not None))
            count, sample = read_back(contender, python, work, out, wanted)
            shutil.rmtree(out)
            result["counts"].append(count)
            result["psnr"], result["quality"] = score(src, contender, sample) if sample else (float("nan"), 0)
            result["sample_missing"] = len(wanted) - len(sample)
            print(
                f"  {name}: {num_images / result['seconds'][-1]:.0f} img/s ({result['seconds'][-1]:.1f} s), "
                f"{count} records",
                flush=True,
            )
            if count != num_images or result["sample_missing"]:
                print(
                    f"!!! {name} wrote {count} records for {num_images} photos "
                    f"({result['sample_missing']} of the {len(wanted)} sampled files missing) !!!",
                    flush=True,
                )
    return results


def print_table(results: dict, num_images: int, repeats: int) -> None:
    """The table: time, rate, the job's speed-up over each, quality, and whether every record came back."""
    rates = {name: num_images / statistics.median(result["seconds"]) for name, result in results.items()}
    job_rate = rates.get("job")
    print()
    print(
        f"| {num_images} photos 500x375 -> {IMAGE_SIZE} px JPEG q{QUALITY}, {CORES} cores, median of {repeats} "
        "| s | images/s | job speed-up (job / this) | PSNR vs Lanczos (dB) | JPEG q written | records |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, result in results.items():
        counts = result["counts"]
        ok = all(count == num_images for count in counts) and not result["sample_missing"]
        records = f"{num_images} ok" if ok else f"NO: {'/'.join(map(str, counts))} of {num_images}"
        speed_up = f"{job_rate / rates[name]:.2f}x" if job_rate else "-"
        print(
            f"| {name}: {CONTENDERS[name].label} | {statistics.median(result['seconds']):.1f} | {rates[name]:.0f} "
            f"| {speed_up} | {result['psnr']:.1f} | {result['quality']} | {records} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument(
        "--peers_venv",
        type=pathlib.Path,
        default=DEFAULT_PEERS_VENV,
        help=f"folder of the peers' own environments, one per peer [{DEFAULT_PEERS_VENV}]",
    )
    parser.add_argument("--only", default=",".join(CONTENDERS), help="comma list of contenders [%(default)s]")
    args = parser.parse_args()
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {','.join(CONTENDERS)}")
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="peers-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"photos-{args.num_images}"
    if not src.exists():
        print(f"making {args.num_images} real-photo JPEGs (500x375) in {src}", flush=True)
        make_photo_tree(src, num_images=args.num_images, size=(500, 375), seed=0)
    pythons = {
        name: sys.executable
        if CONTENDERS[name].venv is None
        else str(ensure_venv(args.peers_venv, CONTENDERS[name].venv))
        for name in names
    }
    print(f"{CORES} cores; {args.repeats} repeats; JPEG quality {QUALITY} asked of every contender", flush=True)
    results = end_to_end(src, work, pythons, names, args.num_images, args.repeats)
    print_table(results, args.num_images, args.repeats)
    print(json.dumps({"packages": PEER_PACKAGES, "results": results}))


if __name__ == "__main__":
    main()

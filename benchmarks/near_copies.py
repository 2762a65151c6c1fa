"""Near-copies: the recall and false groups of the perceptual hash per threshold, and what
``--split_groups near_copies`` adds to a conversion.

Recall and precision are measured on real photographs that are distinct by construction:
non-overlapping 480x360 tiles of large photographs (the JPEG wallpapers of Debian's PACKAGES,
fetched once with ``apt-get download`` into the cache, when the machine can;
always the photographs scikit-image and scikit-learn ship). Each distinct image gets held-out
near-copies, one per edit: re-encoded as JPEG at quality 30-90, resized to 0.5-0.9x, cropped by
up to 5% per side, brightness within 10%, a Gaussian blur of radius 0.5-1.5, and all of them at
once. Recall: the share of copies that are near-copies of their original (grey hashes within the
threshold; in the second table, chromaticity within MAX_CHROMA_STEP too; in the third, the job's
rule, the tone within MAX_TONE_STEPS too). False pairs: pairs of distinct images that are, and
their number as a share of the distinct images. A tile whose pixels are those of an earlier one
(a flat fill of one colour, twice) is not a distinct image, and is left out.

The cost: the command on a sample tree, with and without ``--split_groups near_copies``, whole
processes, interleaved and alternating which goes first; the ratio of medians.

    python benchmarks/near_copies.py                       # recall, precision, cost at 2,000 photos
    python benchmarks/near_copies.py --num_images 8000 --repeats 3
    python benchmarks/near_copies.py --skip_hash --num_images 8000 --collection tiles  # distinct photos
    python benchmarks/near_copies.py --skip_cost           # the hash's table only
    python benchmarks/near_copies.py --skip_cost --tile 240x180   # four times the distinct tiles
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.imaging.perceptual_hash import perceptual_hash  # noqa: E402
from beam_jobs.planning.group_rules import MAX_CHROMA_STEP, MAX_TONE_STEPS, near_copies  # noqa: E402
from beam_jobs.sample_data import make_photo_tree, source_photo_paths  # noqa: E402

CACHE = (
    pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "images-to-tfrecords" / "photos"
)
PACKAGES = (
    "plasma-workspace-wallpapers",
    "mate-backgrounds",
    "lomiri-wallpapers-16.04",
    "lomiri-wallpapers-20.04",
    "ukui-wallpapers",
)
TILE = (480, 360)
# The six edits recall is measured over, then two more a photo editor makes: brightness shifted by
# 25 levels (where "brightness" scales it) and a gamma of 0.8-1.25, in their own columns.
EDITS = ("jpeg", "resize", "crop", "brightness", "blur", "all")
MORE_EDITS = ("shift", "gamma")
THRESHOLDS = (6, 8, 10, 12, 14, 16, 18)
MAX_PIXELS = 100_000_000


def _fetched(package: str) -> pathlib.Path | None:
    """The files of one Debian package, fetched once with ``apt-get download`` into the cache;
    None when the machine cannot."""
    folder = CACHE / "debian" / package
    if folder.exists():
        return folder
    download = pathlib.Path(tempfile.mkdtemp())
    try:
        subprocess.run(["apt-get", "download", package], cwd=download, check=True, capture_output=True, timeout=600)
        for deb in download.glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(download / "x")], check=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(download / "x"), str(folder))
        return folder
    except (OSError, subprocess.SubprocessError) as error:
        print(f"(no {package}: {error})", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(download, ignore_errors=True)


def _wallpapers() -> list[pathlib.Path]:
    """The largest JPEG of each photograph the Debian packages hold, at least 1600 px wide (the
    PNGs are drawings and flat art, not photographs); [] offline."""
    largest: dict[str, pathlib.Path] = {}
    for package in PACKAGES:
        folder = _fetched(package)
        for path in sorted(folder.rglob("*.jpg")) if folder else []:
            # plasma: <name>/contents/images/WxH.jpg; the others: <folder>/<name>[_WxH].jpg
            name = str(path).split("/contents/")[0] if "/contents/" in str(path) else path.stem.split("_")[0]
            key = name if "/contents/" in str(path) else f"{path.parent}/{name}"
            if key not in largest or path.stat().st_size > largest[key].stat().st_size:
                largest[key] = path
    return [path for path in largest.values() if Image.open(path).width >= 1600]


def distinct_images(tile: tuple[int, int] = TILE) -> list[Image.Image]:
    """Non-overlapping tiles of each large photograph (each pixel-distinct from the others), and
    the shipped photographs whole."""
    images, seen = [], set()
    for path in _wallpapers():
        photo = Image.open(path).convert("RGB")
        photo = photo.resize((1920, round(1920 * photo.height / photo.width)), Image.Resampling.LANCZOS)
        for left in range(0, photo.width - tile[0] + 1, tile[0]):
            for top in range(0, photo.height - tile[1] + 1, tile[1]):
                tile_image = photo.crop((left, top, left + tile[0], top + tile[1]))
                if (pixels := tile_image.tobytes()) not in seen:
                    seen.add(pixels)
                    images.append(tile_image)
    images += [Image.open(path).convert("RGB") for path in source_photo_paths().values()]
    return images


def _jpeg(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def near_copy(image: Image.Image, edit: str, rng: random.Random) -> bytes:
    """One held-out near-copy of ``image`` by ``edit`` (see the module's docstring)."""
    w, h = image.size
    every = edit == "all"
    if edit == "crop" or every:
        sides = [rng.uniform(0, 0.05) for _ in range(4)]
        image = image.crop((round(sides[0] * w), round(sides[1] * h), w - round(sides[2] * w), h - round(sides[3] * h)))
    if edit == "resize" or every:
        scale = rng.uniform(0.5, 0.9)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    if edit == "brightness" or every:
        image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.9, 1.1))
    if edit == "blur" or every:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.5)))
    if edit == "shift":
        levels = rng.choice((-25, 25))
        image = image.point(lambda v: min(255, max(0, v + levels)))
    if edit == "gamma":
        gamma = rng.uniform(0.8, 1.25)
        image = image.point(lambda v: round(255 * (v / 255) ** gamma))
    return _jpeg(image, rng.randint(30, 90) if edit in ("jpeg", "all") else 90)


def _chroma(signatures: np.ndarray) -> np.ndarray:
    """The 8 chromaticity bytes of each signature, as int16 rows."""
    low = [int(s) & (2**64 - 1) for s in signatures]
    return np.frombuffer(b"".join(v.to_bytes(8, "big") for v in low), dtype=np.uint8).reshape(-1, 8).astype(np.int16)


def _tone(signatures: np.ndarray) -> np.ndarray:
    """The 2 tone bytes of each signature, as int16 rows."""
    high = [(int(s) >> 128) & 0xFFFF for s in signatures]
    return np.frombuffer(b"".join(v.to_bytes(2, "big") for v in high), dtype=np.uint8).reshape(-1, 2).astype(np.int16)


RULES = {
    "grey hash alone": dict(chroma_step=None, tone_steps=None),
    f"grey hash and colours (chromaticity step <= {MAX_CHROMA_STEP})": dict(
        chroma_step=MAX_CHROMA_STEP, tone_steps=None
    ),
    f"grey hash, colours and tone (tone steps <= {MAX_TONE_STEPS}): the job's rule": dict(
        chroma_step=MAX_CHROMA_STEP, tone_steps=MAX_TONE_STEPS
    ),
}


def hash_table(tile: tuple[int, int] = TILE) -> None:
    """Recall per edit and false pairs per threshold, by the grey hash alone and with the colours."""
    images = distinct_images(tile)
    rng = random.Random(0)
    originals = [perceptual_hash(_jpeg(image), max_pixels=MAX_PIXELS) for image in images]
    copies = {edit: [] for edit in EDITS + MORE_EDITS}
    for image in images:
        for edit in EDITS:
            copies[edit].append(perceptual_hash(near_copy(image, edit, rng), max_pixels=MAX_PIXELS))
    more = random.Random(1)  # its own stream: the six edits' copies are those of a table without these
    for image in images:
        for edit in MORE_EDITS:
            copies[edit].append(perceptual_hash(near_copy(image, edit, more), max_pixels=MAX_PIXELS))
    grey = np.array([(s >> 64) & (2**64 - 1) for s in originals], dtype=np.uint64)
    chroma, tone = _chroma(originals), _tone(originals)
    pairs = np.triu_indices(len(images), 1)
    apart = np.bitwise_count(grey[:, None] ^ grey[None, :])[pairs]
    colours = np.abs(chroma[pairs[0]] - chroma[pairs[1]]).max(axis=1)
    tones = np.abs(tone[pairs[0]] - tone[pairs[1]])
    blobs = [_jpeg(image) for image in images[:200]]
    start = time.perf_counter()
    for blob in blobs:
        perceptual_hash(blob, max_pixels=MAX_PIXELS)
    ms = (time.perf_counter() - start) / len(blobs) * 1000
    print(f"{len(images)} distinct photos ({tile[0]}x{tile[1]} tiles and whole photos), one copy per edit each;")
    print(
        f"signature: {ms:.2f} ms per 480x360 JPEG, one process; "
        f"distinct pairs: median {np.median(apart):.0f} bits apart"
    )
    for rule, steps in RULES.items():
        print(f"\n{rule}\n")
        print(
            "| bits | "
            + " | ".join(EDITS)
            + " | recall, all edits | "
            + " | ".join(MORE_EDITS)
            + " | false pairs | per input |"
        )
        print("|---|" + "---|" * (len(EDITS) + len(MORE_EDITS) + 3))
        for threshold in THRESHOLDS:
            found = {
                edit: [near_copies(o, c, threshold, **steps) for o, c in zip(originals, copies[edit], strict=True)]
                for edit in EDITS + MORE_EDITS
            }
            every = [hit for edit in EDITS for hit in found[edit]]
            near = apart <= threshold
            if steps["chroma_step"] is not None:
                near &= colours <= steps["chroma_step"]
            if steps["tone_steps"] is not None:
                near &= (tones <= np.array(steps["tone_steps"])).all(axis=1)
            false = int(near.sum())
            print(
                f"| {threshold} | "
                + " | ".join(f"{np.mean(found[edit]):.1%}" for edit in EDITS)
                + f" | {np.mean(every):.1%} | "
                + " | ".join(f"{np.mean(found[edit]):.1%}" for edit in MORE_EDITS)
                + f" | {false} | {false / len(images):.2%} |"
            )


def _convert(tree: pathlib.Path, out: pathlib.Path, grouped: bool) -> float:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "beam_jobs", "--input", str(tree), "--output_dir", str(out)]
    command += ["--splits", "train=0.9,validation=0.1"]
    if grouped:
        command += ["--split_groups", "near_copies"]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - start


def make_tile_tree(root: pathlib.Path, num_images: int) -> None:
    """A tree of distinct real photos with a few near-copies of each, as a collection with burst
    shots and re-saves holds: the tiles of distinct_images at two sizes (480x360 and 360x270, so
    no tile is a near-copy of another), each with as many near-copies by random edits as it takes
    to make ``num_images`` (4 for 8,000), in nine class folders."""
    rng = random.Random(0)
    tiles = distinct_images((480, 360)) + distinct_images((360, 270))
    copies = max(1, -(-num_images // len(tiles)) - 1)
    written = 0
    for index, tile in enumerate(tiles):
        folder = root / f"class_{index % 9}"
        folder.mkdir(parents=True, exist_ok=True)
        versions = [_jpeg(tile)] + [near_copy(tile, rng.choice(EDITS + MORE_EDITS), rng) for _ in range(copies)]
        for number, data in enumerate(versions):
            if written == num_images:
                return
            (folder / f"{index:05d}_{number}.jpg").write_bytes(data)
            written += 1
    print(f"(only {written} images: {len(tiles)} distinct tiles with {copies} copies each)")


def cost_table(num_images: int, repeats: int, collection: str) -> None:
    """The conversion with and without the groups, interleaved."""
    with tempfile.TemporaryDirectory() as scratch:
        tree, out = pathlib.Path(scratch) / "photos", pathlib.Path(scratch) / "out"
        if collection == "sample":
            make_photo_tree(tree, num_images=num_images)
        else:
            make_tile_tree(tree, num_images=num_images)
        times: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(repeats):
            for grouped in (False, True) if repeat % 2 == 0 else (True, False):
                times[grouped].append(_convert(tree, out, grouped))
    plain, grouped = statistics.median(times[False]), statistics.median(times[True])
    photos = "sample photos (500x375)" if collection == "sample" else "distinct photos and near-copies (tiles)"
    print(f"\n{num_images} {photos} to 224 px, the command on every core, median of {repeats}\n")
    print("| run | seconds | vs without groups |")
    print("|---|---|---|")
    print(f"| --split_groups none | {plain:.1f} | 1.00x |")
    print(f"| --split_groups near_copies | {grouped:.1f} | {grouped / plain:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip_cost", action="store_true")
    parser.add_argument("--skip_hash", action="store_true")
    parser.add_argument(
        "--tile", default="480x360", help="WxH of the distinct tiles: smaller gives more of them, and flatter ones"
    )
    parser.add_argument(
        "--collection",
        choices=("sample", "tiles"),
        default="sample",
        help="the cost's photos: the sample tree (crops of nine photos, so large groups), or distinct "
        "photos with three near-copies each (tiles of the wallpapers at two sizes)",
    )
    args = parser.parse_args()
    if not args.skip_hash:
        width, height = (int(side) for side in args.tile.split("x"))
        hash_table((width, height))
    if not args.skip_cost:
        cost_table(args.num_images, args.repeats, args.collection)


if __name__ == "__main__":
    main()

"""Resampling candidates for the default: time per image, quality, and aliasing, side by side.

Each candidate is one way of turning a JPEG photo into its 224 px centre crop (decode, resize,
JPEG encode), written here on its own so that a candidate can be judged before the job adopts it:

- ``pillow bicubic``: a full decode and Pillow's bicubic (the pipeline of releases before --resample);
- ``script bilinear``: ``ImageOps.fit`` with a bilinear resize, what the Pillow script of
  benchmarks/conversion.py does;
- ``dct + pillow bicubic``: libjpeg-turbo decodes at the smallest scale M/8 (M = 1..8) that leaves
  at least ``MARGIN`` times the pixels the crop needs, then Pillow's bicubic does the rest;
- ``dct + linear``: the same reduction, then OpenCV's bit-exact bilinear, with a Gaussian
  prefilter of sigma ``0.6 * sqrt(s^2 - 1)`` where the rest of the shrink ``s`` is 1.5x or more;
- ``dct + sinc``: the same reduction, then the job's ``dct_sinc`` (its default): a Lanczos-windowed
  sinc prefilter whose cut-off follows the rest of the shrink, and OpenCV's bicubic sampling
  (Pillow's Lanczos from a 1.5x shrink on).

Quality (a): the PSNR of each output against a Lanczos resize of the full decode over the very
box the candidate cropped, on real photos. Quality (b): aliasing: 1 px stripes (along each axis),
a checkerboard and a zone plate, each shrunk by factors from 1.2x to 8x (as PNG, so no DCT
reduction helps), through the candidates and the job's own ``dct_sinc``, ``dct_bicubic`` and
``dct_linear``;
the table gives the standard deviation of the output (0 is flat: the pattern,
finer than the output can show, is averaged away; 127.5 is the pattern's own), for the zone plate
only over the ring finer than the output's Nyquist frequency. Only the ratios and the dB and std
figures mean anything across machines.

    python benchmarks/resampling.py                 # 200 photos, 5 repeats
    python benchmarks/resampling.py --num_images 60 --repeats 3
"""

from __future__ import annotations

import argparse
import io
import math
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.sample_data import make_photo_tree  # noqa: E402

SIZE = 224
QUALITY = 95
MARGIN = 1.1  # the DCT reduction keeps at least this many times the pixels the crop needs
FACTORS = (1.2, 1.35, 1.5, 1.7, 2.0, 3.0, 5.0, 8.0)


def _cv2():
    import cv2  # pylint: disable=import-outside-toplevel

    cv2.setNumThreads(1)
    return cv2


def _centre_box(width: int, height: int) -> tuple[float, float, float, float]:
    """The centre square, in fractional pixels (crop mode: the shorter side fits)."""
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _encode(pixels: np.ndarray) -> bytes:
    import simplejpeg  # pylint: disable=import-outside-toplevel

    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(pixels), quality=QUALITY, colorspace="RGB", colorsubsampling="420"
    )


def pillow_bicubic(data: bytes) -> tuple[np.ndarray, tuple]:
    from PIL import Image  # pylint: disable=import-outside-toplevel

    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = _centre_box(*image.size)
    return np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BICUBIC, box=box)), box


def script_bilinear(data: bytes) -> tuple[np.ndarray, tuple]:
    from PIL import Image, ImageOps  # pylint: disable=import-outside-toplevel

    image = Image.open(io.BytesIO(data))
    source_width = image.size[0]
    image.draft("RGB", (SIZE, SIZE))  # a DCT reduction by 2, 4 or 8 where the photo is that large
    scale = source_width / image.size[0]
    fitted = ImageOps.fit(image.convert("RGB"), (SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(fitted), tuple(edge * scale for edge in _centre_box(*image.size))


def _dct_reduced(data: bytes) -> tuple[np.ndarray, float, tuple]:
    """The photo decoded at the smallest M/8 scale that keeps MARGIN times what the crop needs,
    that scale, and the crop's box in the reduced image."""
    import simplejpeg  # pylint: disable=import-outside-toplevel

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    need = SIZE / min(width, height) * MARGIN
    pixels = simplejpeg.decode_jpeg(
        data,
        colorspace="RGB",
        fastdct=False,
        fastupsample=False,
        min_width=math.ceil(width * need),
        min_height=math.ceil(height * need),
    )
    scale = next(m / 8 for m in range(1, 17) if math.ceil(width * m / 8) == pixels.shape[1])
    box = tuple(edge * scale for edge in _centre_box(width, height))
    return pixels, scale, box


def dct_pillow_bicubic(data: bytes) -> tuple[np.ndarray, tuple]:
    from PIL import Image  # pylint: disable=import-outside-toplevel

    pixels, scale, box = _dct_reduced(data)
    image = Image.frombuffer("RGB", (pixels.shape[1], pixels.shape[0]), pixels, "raw", "RGB", 0, 1)
    return np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BICUBIC, box=box)), tuple(e / scale for e in box)


def linear_with_prefilter(pixels: np.ndarray) -> np.ndarray:
    """OpenCV's bit-exact bilinear, after a bit-exact Gaussian wherever an axis shrinks 1.5x or more."""
    cv2 = _cv2()
    scale_x, scale_y = pixels.shape[1] / SIZE, pixels.shape[0] / SIZE
    sigma_x, sigma_y = (0.6 * math.sqrt(s * s - 1) if s >= 1.5 else 0.0 for s in (scale_x, scale_y))
    if sigma_x or sigma_y:
        kernel = (2 * math.ceil(3 * sigma_x) + 1 if sigma_x else 1, 2 * math.ceil(3 * sigma_y) + 1 if sigma_y else 1)
        pixels = cv2.GaussianBlur(
            pixels, kernel, sigmaX=sigma_x or 1e-3, sigmaY=sigma_y or 1e-3, borderType=cv2.BORDER_REFLECT
        )
    return cv2.resize(pixels, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR_EXACT)


def dct_linear(data: bytes) -> tuple[np.ndarray, tuple]:
    pixels, scale, box = _dct_reduced(data)
    left, top, right, bottom = (round(edge) for edge in box)  # an array slice: whole pixels
    crop = np.ascontiguousarray(pixels[top:bottom, left:right])
    return linear_with_prefilter(crop), tuple(edge / scale for edge in (left, top, right, bottom))


def dct_sinc(data: bytes) -> tuple[np.ndarray, tuple]:
    from beam_jobs.imaging.resample import resample_array  # pylint: disable=import-outside-toplevel

    pixels, scale, box = _dct_reduced(data)
    left, top, right, bottom = (round(edge) for edge in box)  # an array slice: whole pixels
    crop = np.ascontiguousarray(pixels[top:bottom, left:right])
    return resample_array(crop, (SIZE, SIZE), "dct_sinc"), tuple(edge / scale for edge in (left, top, right, bottom))


CANDIDATES = {
    "pillow bicubic (the first releases' default)": pillow_bicubic,
    "script bilinear (ImageOps.fit)": script_bilinear,
    f"dct >= {MARGIN}x + pillow bicubic": dct_pillow_bicubic,
    f"dct >= {MARGIN}x + linear (prefilter from 1.5x)": dct_linear,
    f"dct >= {MARGIN}x + sinc prefilter + cubic (the job's default)": dct_sinc,
}


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(255.0**2 / mse)


def quality_and_time(blobs: list[bytes], repeats: int) -> dict[str, tuple[float, float]]:
    """{candidate: (median ms per image, decode + resize + encode; mean PSNR in dB)}."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    full = [Image.open(io.BytesIO(data)).convert("RGB") for data in blobs]
    times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for repeat in range(repeats):
        names = list(CANDIDATES) if repeat % 2 == 0 else list(CANDIDATES)[::-1]
        for name in names:
            began = time.perf_counter()
            for data in blobs:
                _encode(CANDIDATES[name](data)[0])
            times[name].append((time.perf_counter() - began) / len(blobs) * 1000)
    results = {}
    for name, candidate in CANDIDATES.items():
        scores = []
        for data, image in zip(blobs, full, strict=True):
            pixels, box = candidate(data)
            stored = np.asarray(Image.open(io.BytesIO(_encode(pixels))).convert("RGB"))
            reference = np.asarray(image.resize((SIZE, SIZE), Image.Resampling.LANCZOS, box=box))
            scores.append(_psnr(stored, reference))
        results[name] = (statistics.median(times[name]), statistics.mean(scores))
    return results


def patterns(side: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{name: (an RGB pattern side x side, a mask of the output pixels that must be flat or None)}."""
    y, x = np.mgrid[0:side, 0:side]
    stripes_x = ((x % 2) * 255).astype(np.uint8)
    radius2 = (x - side / 2) ** 2 + (y - side / 2) ** 2
    zone = (127.5 * (1 + np.cos(math.pi * radius2 / side))).round().astype(np.uint8)  # local frequency r / side
    rgb = {
        "stripes along x": stripes_x,
        "stripes along y": stripes_x.T.copy(),
        "checkerboard": (((x + y) % 2) * 255).astype(np.uint8),
        "zone plate": zone,
    }
    # The zone plate's ring finer than the output can show: local frequency above 0.5 / scale
    # cycles per source pixel, with 20% of margin for a filter's transition band.
    scale = side / SIZE
    oy, ox = np.mgrid[0:SIZE, 0:SIZE]
    out_radius = np.hypot((ox + 0.5) * scale - side / 2, (oy + 0.5) * scale - side / 2)
    ring = (out_radius / side > 1.2 * 0.5 / scale) & (out_radius < side / 2)
    return {
        name: (np.repeat(p[..., None], 3, axis=2), ring if name == "zone plate" else None) for name, p in rgb.items()
    }


def aliasing() -> dict[str, dict[str, dict[float, float]]]:
    """{resampler: {pattern: {factor: std of the output (over the zone plate's fine ring)}}}."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    from beam_jobs.imaging.resample import resample_array  # pylint: disable=import-outside-toplevel

    resamplers = {
        "pillow bicubic": lambda p: np.asarray(Image.fromarray(p).resize((SIZE, SIZE), Image.Resampling.BICUBIC)),
        "pillow bilinear": lambda p: np.asarray(Image.fromarray(p).resize((SIZE, SIZE), Image.Resampling.BILINEAR)),
        "linear (prefilter from 1.5x)": linear_with_prefilter,
        # The job's own array methods, as its workers call them on an image that is not a JPEG.
        "job dct_sinc (the default)": lambda p: resample_array(p, (SIZE, SIZE), "dct_sinc"),
        "job dct_bicubic": lambda p: resample_array(p, (SIZE, SIZE), "dct_bicubic"),
        "job dct_linear": lambda p: resample_array(p, (SIZE, SIZE), "dct_linear"),
    }
    table: dict[str, dict[str, dict[float, float]]] = {name: {} for name in resamplers}
    for factor in FACTORS:
        for pattern, (pixels, mask) in patterns(round(SIZE * factor)).items():
            for name, resample in resamplers.items():
                out = resample(pixels)[..., 0].astype(np.float64)
                table[name].setdefault(pattern, {})[factor] = float((out[mask] if mask is not None else out).std())
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        paths = make_photo_tree(scratch, num_images=args.num_images)
        blobs = [path.read_bytes() for path in paths]
    results = quality_and_time(blobs, args.repeats)
    base_ms = results["pillow bicubic (the first releases' default)"][0]
    print(f"{len(blobs)} photos of 500x375 to {SIZE}x{SIZE}, median of {args.repeats}, one process\n")
    print("| candidate | ms per image | speed vs pillow bicubic | PSNR vs Lanczos (dB) |")
    print("|---|---|---|---|")
    for name, (ms, psnr) in results.items():
        print(f"| {name} | {ms:.2f} | {base_ms / ms:.2f}x | {psnr:.2f} |")
    print("\nAliasing: the output's standard deviation (0 is flat; 127.5 is the pattern untouched)\n")
    table = aliasing()
    print("| resampler | pattern | " + " | ".join(f"{f:g}x" for f in FACTORS) + " |")
    print("|---|---|" + "---|" * len(FACTORS))
    for name, rows in table.items():
        for pattern, values in rows.items():
            print(f"| {name} | {pattern} | " + " | ".join(f"{values[f]:.1f}" for f in FACTORS) + " |")


if __name__ == "__main__":
    main()

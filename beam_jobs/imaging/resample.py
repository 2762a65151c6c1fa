"""Resampling an upright 8-bit image to its output size: the --resample methods.

Pillow's filters antialias at every scale, "antialias" and "area" only partly (see
DEFAULT_RESAMPLE). What each costs, how close it comes to a Lanczos resize of the full-resolution
source (PSNR over real photos) and how much fine periodic detail it lets through as moire are
measured by benchmarks/resampling.py and benchmarks/conversion.py, and given in docs/converting.md.

- "dct_sinc", the default for new datasets: a JPEG is decoded by libjpeg-turbo at the smallest
  of its DCT scales M/8 that keeps DCT_MARGIN times the pixels the output needs, as for
  "dct_bicubic". Where the rest of the shrink is under 1.5x on both axes (every photo up to about
  4x the output), a Lanczos-windowed sinc whose cut-off follows the scale (SINC_CUTOFF times the
  output's Nyquist frequency), then OpenCV's bicubic sampling; from 1.5x, Pillow's Lanczos. The
  decode's scale is chosen by its exact size and the box is resampled as it is, fractional edges
  included (resample_box), so the output is not shifted or stretched by the whole-pixel rounding
  the older array methods keep. Closer to a Lanczos resize of the full source than "dct_bicubic"
  at about a third of its resize time, and flatter on fine stripes from 1.2x.
- "dct_bicubic", the default before "dct_sinc": a JPEG is decoded by libjpeg-turbo at the smallest
  of its DCT scales M/8 (M = 1..8) that keeps DCT_MARGIN times the pixels the output needs (the
  scaled inverse DCT drops the frequencies the reduced size cannot hold, so the reduction itself
  does not alias); then Pillow's bicubic, on the whole pixels the reduction kept. The PSNR of
  "bicubic" at every photo size measured, and its antialiasing, at a fraction of its decode and
  resize (a 2000x1500 photo is decoded at 1/4, where Pillow's draft stops at 1/2).
- "dct_linear": the same reduction; then, on any axis that still shrinks 1.5x or more (a source
  that is not a JPEG, or a remaining shrink of 1.5x to 2x after the reduction), a Gaussian
  prefilter of sigma 0.8 * sqrt(s^2 - 1), and OpenCV's bit-exact bilinear sampling. The fastest
  method that leaves fine stripes, checkerboards and zone plates shrunk 1.5x to 8x flat, but the
  Gaussian is soft: 1 to 5 dB of PSNR below "dct_bicubic" on real photos.
- "antialias": where an axis shrinks more than 2x, a Gaussian prefilter of sigma
  (scale - 1) / 2 on it (as scikit-image's resize(anti_aliasing=True) does); then OpenCV's
  bilinear sampling, which up to 2x averages the source pixels between output ones. Both steps
  are OpenCV's bit-exact fixed-point versions (INTER_LINEAR_EXACT; the 8-bit GaussianBlur), so
  the bytes do not depend on which SIMD instructions a worker's CPU has.
- "area": OpenCV's INTER_AREA, each output pixel the mean of the source area it covers.
- "bilinear", "bicubic", "lanczos": Pillow's filters (antialiased: their support widens with the
  scale). "bicubic" is what every version before --resample existed did, byte for byte, so a
  dataset made then can be resumed or appended to as it was.

The first five work on numpy arrays (the job's fast path, example_conversion.py); Pillow's on PIL images.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from PIL import Image

__all__ = [
    "ARRAY_METHODS",
    "DCT_MARGIN",
    "DCT_REDUCED_METHODS",
    "DEFAULT_RESAMPLE",
    "EXACT_SCALE_METHODS",
    "cuts_whole_pixels",
    "LEGACY_RESAMPLE",
    "PILLOW_METHODS",
    "RESAMPLE_METHODS",
    "SINC_CUTOFF",
    "SINC_STEP",
    "SINC_UNTIL",
    "resample_array",
    "resample_box",
    "resample_image",
    "sinc_prefilter_taps",
]

ARRAY_METHODS = ("dct_sinc", "dct_linear", "dct_bicubic", "antialias", "area")
PILLOW_METHODS = ("bilinear", "bicubic", "lanczos")
RESAMPLE_METHODS = ARRAY_METHODS + PILLOW_METHODS
# The methods whose JPEG decode may use any DCT scale M/8, not only Pillow's draft scales (1/2,
# 1/4, 1/8 where the image is at least twice the need), and the share of pixels above the need
# they keep: with none, PSNR against a Lanczos resize fell 0.9 dB (a scaled IDCT is a block-wise
# low-pass, soft near its own cut-off); 1.05 to 1.2 measured alike (benchmarks/resampling.py).
DCT_REDUCED_METHODS = ("dct_sinc", "dct_linear", "dct_bicubic")
# Of those, the ones whose scale is chosen by its exact size (source * M/8, not libjpeg-turbo's
# rounded-up one) and whose part-pixel row and column are rounded to the nearest, not dropped
# (decode._scaled_exactly): dropped, a 333 px side at 6/8 lost 0.75 of a pixel and the image
# shrank by 0.3%. The older methods keep the rule their datasets were made with, byte for byte.
EXACT_SCALE_METHODS = ("dct_sinc",)


def cuts_whole_pixels(method: str) -> bool:
    """Whether ``method`` resamples a box with whole-pixel edges (an array slice): the array
    methods but EXACT_SCALE_METHODS, which resample the exact box (resample_box)."""
    return method in ARRAY_METHODS and method not in EXACT_SCALE_METHODS


DCT_MARGIN = 1.1
# The default of new datasets (a run that continues one, --resume or --append, keeps the method
# its manifest or run folder records: preflight.with_dataset_defaults): chosen by measurement
# (docs/benchmarks.md, benchmarks/resampling.py) as the fastest method at least as close to a
# Lanczos resize as Pillow's bicubic that leaves fine stripes, checkerboards and zone plates shrunk
# 1.5x or more as flat as Pillow's bicubic does. "dct_bicubic" (the default before it) has the
# same antialiasing at about three times the resize time; "dct_linear" is faster still but soft
# (1 to 5 dB below); "antialias" and "area" let fine periodic detail through as moire between a 1x
# and a 2x shrink (1 px stripes shrunk 1.7x keep a standard deviation of 73 of 255 with
# "antialias", 20 with "area", 3 with "bicubic" and "dct_bicubic").
DEFAULT_RESAMPLE = "dct_sinc"
# The one resampling of releases before --resample (a fingerprint without the setting means it).
LEGACY_RESAMPLE = "bicubic"

# "dct_sinc": the prefilter's cut-off as a multiple of the output's Nyquist frequency (0.95 to
# 1.15 measured: 1.05 came closest to a Lanczos resize of the full decode), its Lanczos window's
# lobes, and the shrink from which Pillow's Lanczos takes over (a prefilter that runs on every
# source pixel costs more than a resampling filter evaluated at the output's, the wider it gets).
SINC_CUTOFF = 1.05
SINC_LOBES = 3
SINC_UNTIL = 1.5
# The prefilter's taps are whole multiples of 1/SINC_STEP, so that OpenCV's float filter is exact:
# with taps whose magnitudes sum to at most 1.57 (every scale below SINC_UNTIL, every delay), a row
# pass's sums are multiples of 1/128 below 2^9 and a column pass's multiples of 1/16384 below
# 2^10, at most 24 significant bits, float32's own. No rounding happens before the one to 8 bits
# (half to even), so neither the order of the sums nor a fused multiply-add (which AVX2 and NEON
# have and SSE2 lacks) changes a byte.
SINC_STEP = 128

_PILLOW_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
_cv2 = None


def opencv():
    """OpenCV, imported on first use (it costs about 0.1 s) and limited to one thread: the job's
    parallelism is its workers, one image per call, and OpenCV's own thread pool on top of them
    would only contend for the same cores."""
    global _cv2  # pylint: disable=global-statement
    if _cv2 is None:
        import cv2  # pylint: disable=import-outside-toplevel

        cv2.setNumThreads(1)
        _cv2 = cv2
    return _cv2


def _prefilter_sigma(scale: float) -> float:
    """(scale - 1) / 2, scikit-image's antialiasing sigma, where the image shrinks more than 2x;
    0 up to 2x, where bilinear sampling itself averages the source pixels between output ones
    (at 1.67x the prefilter's sigma of 0.33 changed no PSNR measured, and cost a fifth of the
    per-image time), so the prefilter is skipped."""
    return (scale - 1) / 2 if scale > 2 else 0.0


def _linear_sigma(scale: float) -> float:
    """0.8 * sqrt(scale^2 - 1), "dct_linear"'s prefilter, from a 1.5x shrink on: the blur that,
    added to what bilinear sampling at that scale does itself, leaves 1 px stripes, a
    checkerboard and a zone plate flat (a standard deviation under 5 of 255) at every factor from
    1.5x to 8x; 0.6 left stripes at 14 (1.5x) and 7 (1.7x). Below 1.5x a prefilter wide enough to
    flatten stripes blurred photos by 1.3 dB of PSNR, and a JPEG's DCT reduction already removed
    what is finer than the reduced image holds."""
    return 0.8 * math.sqrt(scale * scale - 1) if scale >= 1.5 else 0.0


def _gaussian_prefilter(
    pixels: np.ndarray, scale_x: float, scale_y: float, sigma_for: Callable[[float], float] = _prefilter_sigma
) -> np.ndarray:
    sigma_x, sigma_y = sigma_for(scale_x), sigma_for(scale_y)
    if sigma_x == 0 and sigma_y == 0:
        return pixels
    # A kernel of +-3 sigma; size 1 (no blur) on an axis that is not shrunk. OpenCV reads a zero
    # sigma as "take the other axis's", hence the tiny positive one there (a 1-tap kernel is 1).
    size = (2 * math.ceil(3 * sigma_x) + 1 if sigma_x else 1, 2 * math.ceil(3 * sigma_y) + 1 if sigma_y else 1)
    return opencv().GaussianBlur(
        pixels, size, sigmaX=sigma_x or 1e-3, sigmaY=sigma_y or 1e-3, borderType=opencv().BORDER_REFLECT
    )


@functools.lru_cache(maxsize=1024)
def sinc_prefilter_taps(scale: float, delay: float = 0.0) -> tuple[float, ...] | None:
    """The "dct_sinc" prefilter for a shrink by ``scale`` on one axis, its output pixel i taken at
    source position i + ``delay`` (0 <= delay < 1: a box edge between two pixels), or None where it
    would do nothing (no delay, and a shrink of at most SINC_CUTOFF: nothing the output can hold
    is above its cut-off). A sinc whose cut-off is SINC_CUTOFF / scale of the source's Nyquist
    frequency (at most the Nyquist frequency itself: an interpolator), in a Lanczos window of
    SINC_LOBES lobes, normalised to sum to exactly 1 in steps of 1/SINC_STEP (see SINC_STEP); its
    tap k (from -(len - 1) // 2 when there is no delay, from -len // 2 + 1 when there is) weighs
    the source pixel at offset k."""
    cutoff = min(1.0, SINC_CUTOFF / scale)
    if cutoff >= 1 and not delay:
        return None
    half = max(1, math.floor(SINC_LOBES / cutoff))
    offsets = np.arange(-half, half + (2 if delay else 1), dtype=np.float64) - delay
    taps = np.sinc(cutoff * offsets) * np.sinc(cutoff * offsets / SINC_LOBES)
    taps[np.abs(cutoff * offsets) >= SINC_LOBES] = 0.0  # the window ends at its last lobe
    steps = np.round(taps / taps.sum() * SINC_STEP)
    steps[int(np.argmax(steps))] += SINC_STEP - steps.sum()  # the rounding's rest on the largest tap: a sum of 1
    return tuple(float(step) / SINC_STEP for step in steps)


def _pillow_resize(pixels: np.ndarray, size: tuple[int, int], resample_filter: Image.Resampling) -> np.ndarray:
    height, width = pixels.shape[:2]
    mode = "RGB" if pixels.ndim == 3 and pixels.shape[2] == 3 else "L"
    image = Image.frombuffer(mode, (width, height), np.ascontiguousarray(pixels), "raw", mode, 0, 1)
    return np.asarray(image.resize(size, resample_filter))


def _pillow_box_resize(
    pixels: np.ndarray, size: tuple[int, int], resample_filter: Image.Resampling, box: tuple[float, float, float, float]
) -> np.ndarray:
    height, width = pixels.shape[:2]
    mode = "RGB" if pixels.ndim == 3 and pixels.shape[2] == 3 else "L"
    image = Image.frombuffer(mode, (width, height), np.ascontiguousarray(pixels), "raw", mode, 0, 1)
    return np.asarray(image.resize(size, resample_filter, box=box))


def resample_box(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int]) -> np.ndarray:
    """ "dct_sinc": the ``box`` of ``pixels`` (left, top, right, bottom; fractional edges are kept,
    not rounded to whole pixels) resampled to ``size`` (width, height).

    The prefilter of each axis that shrinks (sinc_prefilter_taps), with the box's fractional left
    and top edges as its delay, on the box and a margin of real neighbours around it; then
    OpenCV's bicubic sampling (4 taps, which alone would alias what the prefilter removed) at the
    box's exact scale. From a
    SINC_UNTIL shrink on either axis, Pillow's Lanczos over the exact box instead. A whole-pixel
    box, as an array slice cuts it, is half a pixel off the centre whenever the source and the
    output differ in parity (271x180 to a 224 px square): 29 dB of PSNR against an exact Lanczos
    resize of sharp photos, where the exact box gives 47."""
    x0, y0, x1, y1 = box
    rows, columns = pixels.shape[:2]
    scale_x, scale_y = (x1 - x0) / size[0], (y1 - y0) / size[1]
    if max(scale_x, scale_y) >= SINC_UNTIL:
        # A part-pixel rounded away leaves the box up to half a pixel past the array: Pillow
        # refuses that, and its edge pixels stand for the rest.
        inside = (x0, y0, min(x1, float(columns)), min(y1, float(rows)))
        return _pillow_box_resize(pixels, size, Image.Resampling.LANCZOS, inside)
    left, top = min(math.floor(x0), columns - 1), min(math.floor(y0), rows - 1)
    # The box's whole extent and, where the source has them, 2 more pixels: bicubic sampling's
    # neighbours at the far edge; what they add to the output is cut off below.
    width = max(1, min(columns - left, math.ceil(x1 - x0) + 2))
    height = max(1, min(rows - top, math.ceil(y1 - y0) + 2))
    taps_x, taps_y = sinc_prefilter_taps(scale_x, x0 - left), sinc_prefilter_taps(scale_y, y0 - top)
    cv2 = opencv()
    if taps_x or taps_y:
        reach_x, reach_y = (len(taps) if taps else 0 for taps in (taps_x, taps_y))
        r0, c0 = max(0, top - reach_y), max(0, left - reach_x)
        region = pixels[r0 : min(rows, top + height + reach_y), c0 : min(columns, left + width + reach_x)]
        kernel_x, kernel_y = (np.array(taps or (1.0,), dtype=np.float64) for taps in (taps_x, taps_y))
        anchor = ((len(taps_x) - 1) // 2 if taps_x else 0, (len(taps_y) - 1) // 2 if taps_y else 0)
        filtered = cv2.sepFilter2D(
            np.ascontiguousarray(region), -1, kernel_x, kernel_y, anchor=anchor, borderType=cv2.BORDER_REFLECT
        )
        crop = filtered[top - r0 : top - r0 + height, left - c0 : left - c0 + width]
    else:
        crop = pixels[top : top + height, left : left + width]
    # Given scale factors (and no output size), OpenCV keeps them exact: output pixel j samples
    # (j + 0.5) * scale - 0.5, the box's own scale, not the rounded crop's.
    resized = cv2.resize(
        np.ascontiguousarray(crop), None, fx=1 / scale_x, fy=1 / scale_y, interpolation=cv2.INTER_CUBIC
    )
    resized = resized[: size[1], : size[0]]
    if resized.shape[:2] != (size[1], size[0]):  # a box that ends within a float's error of the output
        resized = cv2.copyMakeBorder(
            resized, 0, size[1] - resized.shape[0], 0, size[0] - resized.shape[1], cv2.BORDER_REPLICATE
        )
    return resized.reshape(size[1], size[0], *pixels.shape[2:])  # OpenCV drops a channel axis of 1


def resample_array(pixels: np.ndarray, size: tuple[int, int], method: str) -> np.ndarray:
    """``pixels`` (H x W x C uint8, contiguous) resampled to ``size`` (width, height)."""
    height, width = pixels.shape[:2]
    if (width, height) == tuple(size):
        return pixels
    cv2 = opencv()
    if method == "dct_sinc":
        return resample_box(pixels, (0, 0, width, height), size)
    if method == "dct_linear":
        blurred = _gaussian_prefilter(pixels, width / size[0], height / size[1], sigma_for=_linear_sigma)
        resized = cv2.resize(blurred, size, interpolation=cv2.INTER_LINEAR_EXACT)
    elif method == "dct_bicubic":
        resized = _pillow_resize(pixels, size, Image.Resampling.BICUBIC)
    elif method == "antialias":
        blurred = _gaussian_prefilter(pixels, width / size[0], height / size[1])
        resized = cv2.resize(blurred, size, interpolation=cv2.INTER_LINEAR_EXACT)
    elif method == "area":
        resized = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)
    else:
        raise ValueError(f"resample_array takes {ARRAY_METHODS} (got {method!r})")
    return resized.reshape(size[1], size[0], *pixels.shape[2:])  # OpenCV drops a channel axis of 1


def resample_image(
    image: Image.Image, size: tuple[int, int], method: str, box: tuple[float, float, float, float] | None = None
) -> Image.Image:
    """``image`` (or its ``box``: left, top, right, bottom, fractional edges allowed) resampled
    to ``size`` (width, height) with one of Pillow's filters."""
    try:
        resample_filter = _PILLOW_FILTERS[method]
    except KeyError:
        raise ValueError(f"resample_image takes {PILLOW_METHODS} (got {method!r})") from None
    return image.resize(size, resample_filter, box=box)

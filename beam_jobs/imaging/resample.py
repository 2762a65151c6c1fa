"""Resampling an upright 8-bit image to its output size: the --resample methods.

Pillow's filters antialias at every scale; the two array methods only partly (see DEFAULT_RESAMPLE).
What each costs and how close it comes to a Lanczos
resize of the full-resolution source (PSNR over real photos) is measured by
benchmarks/conversion.py and given in the README.

- "antialias": where an axis shrinks more than 2x, a Gaussian prefilter of sigma
  (scale - 1) / 2 on it (as scikit-image's resize(anti_aliasing=True) does); then OpenCV's
  bilinear sampling, which up to 2x averages the source pixels between output ones. Both steps
  are OpenCV's bit-exact fixed-point versions (INTER_LINEAR_EXACT; the 8-bit GaussianBlur), so
  the bytes do not depend on which SIMD instructions a worker's CPU has.
- "area": OpenCV's INTER_AREA, each output pixel the mean of the source area it covers.
- "bilinear", "bicubic", "lanczos": Pillow's filters (antialiased: their support widens with the
  scale). "bicubic", the default, is what every version before --resample existed did, byte for
  byte, so a dataset made then can be resumed or appended to as it was.

The first two work on numpy arrays (the job's fast path, pixels.py); Pillow's on PIL images.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

__all__ = [
    "ARRAY_METHODS",
    "DEFAULT_RESAMPLE",
    "LEGACY_RESAMPLE",
    "PILLOW_METHODS",
    "RESAMPLE_METHODS",
    "resample_array",
    "resample_image",
]

ARRAY_METHODS = ("antialias", "area")
PILLOW_METHODS = ("bilinear", "bicubic", "lanczos")
RESAMPLE_METHODS = ARRAY_METHODS + PILLOW_METHODS
# The default stays the pipeline of earlier releases: the array methods are faster, but between
# a 1x and a 2x shrink they let fine periodic detail (stripes, checkerboards) through as moire
# (measured: 1 px stripes shrunk 1.7x keep a standard deviation of 73 of 255 with "antialias",
# 20 with "area", 3 with "bicubic"), and "antialias"'s prefilter grows slow for large shrinks of
# sources that are not JPEGs (no DCT-domain reduction first).
DEFAULT_RESAMPLE = "bicubic"
# The one resampling of releases before --resample (a fingerprint without the setting means it).
LEGACY_RESAMPLE = "bicubic"

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


def _gaussian_prefilter(pixels: np.ndarray, scale_x: float, scale_y: float) -> np.ndarray:
    sigma_x, sigma_y = _prefilter_sigma(scale_x), _prefilter_sigma(scale_y)
    if sigma_x == 0 and sigma_y == 0:
        return pixels
    # A kernel of +-3 sigma; size 1 (no blur) on an axis that is not shrunk. OpenCV reads a zero
    # sigma as "take the other axis's", hence the tiny positive one there (a 1-tap kernel is 1).
    size = (2 * math.ceil(3 * sigma_x) + 1 if sigma_x else 1, 2 * math.ceil(3 * sigma_y) + 1 if sigma_y else 1)
    return opencv().GaussianBlur(
        pixels, size, sigmaX=sigma_x or 1e-3, sigmaY=sigma_y or 1e-3, borderType=opencv().BORDER_REFLECT
    )


def resample_array(pixels: np.ndarray, size: tuple[int, int], method: str) -> np.ndarray:
    """``pixels`` (H x W x C uint8, contiguous) resampled to ``size`` (width, height)."""
    height, width = pixels.shape[:2]
    if (width, height) == tuple(size):
        return pixels
    cv2 = opencv()
    if method == "antialias":
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

"""Pure pixel preprocessing: colour-mode normalisation and resizing by a Placement (geometry.py)."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from beam_jobs.errors import BadInputError, Reason, Stage
from beam_jobs.imaging.geometry import KEEP, Placement, kept_size, place
from beam_jobs.imaging.resample import (
    ARRAY_METHODS,
    DEFAULT_RESAMPLE,
    EXACT_SCALE_METHODS,
    cuts_whole_pixels,
    resample_array,
    resample_box,
    resample_image,
)

__all__ = [
    "ALPHA_BACKGROUND",
    "PAD_FILL",
    "RESIZE_MODES",
    "normalize_mode",
    "required_source_size",
    "resize_image",
    "resize_image_by",
    "resize_pixels",
    "resize_pixels_by",
]

# Transparent pixels are composited on white, as browsers and image viewers show them.
ALPHA_BACKGROUND = (255, 255, 255)
# Letterbox bars of the pad mode are black, as in most detection and video pipelines.
PAD_FILL = (0, 0, 0)
RESIZE_MODES = ("crop", "pad", "stretch", KEEP)

_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _to_uint8_gray(values: np.ndarray, full_scale: float) -> Image.Image:
    # Scale linearly so that full_scale maps to 255: 16-bit data keeps its whole range instead of
    # saturating at 255, which is what Pillow's convert("L") does to I;16.
    scaled = np.rint(values.astype(np.float64) * (255.0 / full_scale))
    return Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), mode="L")


def _high_bit_depth_to_gray(image: Image.Image) -> Image.Image:
    values = np.asarray(image)
    if image.mode in _SIXTEEN_BIT_MODES:
        return _to_uint8_gray(values, 65535.0)
    if image.mode == "I":
        # 32-bit integers: PNG and TIFF loaders use this mode for 16-bit data too.
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high <= 65535:
            return _to_uint8_gray(values, 65535.0 if high > 255 else 255.0)
        return _to_uint8_gray(values - low, float(max(high - low, 1)))
    # "F": floats in [0, 1] are taken as intensities; any other range is stretched to [0, 255].
    finite = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lowest, highest = float(finite.min()), float(finite.max())
    if lowest >= 0.0 and highest <= 1.0:
        return _to_uint8_gray(finite, 1.0)
    return _to_uint8_gray(finite - lowest, max(highest - lowest, 1e-12))


def _composite_on_background(image: Image.Image) -> Image.Image:
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, ALPHA_BACKGROUND + (255,))
    return Image.alpha_composite(background, rgba).convert("RGB")


def normalize_mode(image: Image.Image, *, channels: int) -> Image.Image:
    """Returns an 8-bit "RGB" (channels=3) or "L" (channels=1) image with documented colours.

    - CMYK, YCbCr, LAB, HSV: converted to RGB.
    - P with transparency, PA, LA, RGBA: composited on ALPHA_BACKGROUND (white).
    - I;16 and I: scaled from their 16-bit range to 8 bits, never clipped.
    - F: [0, 1] floats scaled to [0, 255]; other ranges stretched min-to-max.
    - 1: black and white become 0 and 255.
    - Grayscale becomes 3 identical channels unless channels=1.
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3 (got {channels!r})")
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES or mode in ("I", "F"):
        image = _high_bit_depth_to_gray(image)
    elif mode == "P":
        image = _composite_on_background(image) if "transparency" in image.info else image.convert("RGB")
    elif mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        image = _composite_on_background(image)
    elif mode == "1":
        image = image.convert("L")
    elif mode in ("CMYK", "YCbCr", "LAB", "HSV", "RGBX"):
        image = image.convert("RGB")
    elif mode not in ("RGB", "L"):
        raise BadInputError(Stage.PREPROCESS, Reason.UNSUPPORTED_MODE, f"image mode {mode!r} is not supported")
    target = "RGB" if channels == 3 else "L"
    return image if image.mode == target else image.convert(target)


def _scale_for(
    source: tuple[int, int], target: tuple[int, int], resize_mode: str, max_side: int | None = None
) -> tuple[float, float]:
    if resize_mode == KEEP:
        out = kept_size(source, max_side)
        return out[0] / source[0], out[1] / source[1]
    (src_w, src_h), (dst_w, dst_h) = source, target
    if resize_mode == "crop":
        scale = max(dst_w / src_w, dst_h / src_h)
        return scale, scale
    if resize_mode == "pad":
        scale = min(dst_w / src_w, dst_h / src_h)
        return scale, scale
    if resize_mode == "stretch":
        return dst_w / src_w, dst_h / src_h
    raise ValueError(f"resize_mode must be one of {RESIZE_MODES} (got {resize_mode!r})")


def required_source_size(
    source: tuple[int, int],
    target: tuple[int, int],
    resize_mode: str,
    max_side: int | None = None,
    margin: float = 1.0,
) -> tuple[int, int]:
    """The smallest (width, height) the source may be reduced to before resizing loses nothing,
    with ``margin`` times the pixels on each axis (never more than the source has).

    JPEG draft decoding may shrink the source to this size or larger, never smaller.
    """
    scale_w, scale_h = _scale_for(source, target, resize_mode, max_side)
    # The epsilon keeps float noise (3000 * (224 / 3000) = 224.00000000000003) from adding a pixel.
    return (
        min(source[0], max(1, math.ceil(source[0] * scale_w * margin - 1e-9))),
        min(source[1], max(1, math.ceil(source[1] * scale_h * margin - 1e-9))),
    )


def resize_image_by(image: Image.Image, placement: Placement, resample_method: str = DEFAULT_RESAMPLE) -> Image.Image:
    """Resizes the upright ``image`` by ``placement`` (geometry.py) with antialiasing (resample.py):
    its source box scaled onto its target box, any rest of the output PAD_FILL.

    - crop: scale so the shorter side fits, then take the centre (no distortion, edges lost);
    - pad: scale so the longer side fits, then centre on PAD_FILL (no distortion, nothing lost);
    - stretch: scale each axis independently (distortion, nothing lost);
    - keep: the image as it is, or shrunk to --max_side.
    """
    if resample_method in ARRAY_METHODS:
        return Image.fromarray(resize_pixels_by(np.asarray(image), placement, resample_method), mode=image.mode)
    if placement.is_identity and image.size == placement.output_size:
        return image
    tx0, ty0, tx1, ty1 = placement.target_box
    box = placement.source_box
    whole = box == (0, 0, *image.size)
    inner = resample_image(image, (tx1 - tx0, ty1 - ty0), resample_method, box=None if whole else box)
    if (tx0, ty0, tx1, ty1) == (0, 0, *placement.output_size):
        return inner
    fill = PAD_FILL if image.mode == "RGB" else PAD_FILL[0]
    canvas = Image.new(image.mode, placement.output_size, fill)
    canvas.paste(inner, (tx0, ty0))
    return canvas


def resize_pixels_by(pixels: np.ndarray, placement: Placement, resample_method: str = DEFAULT_RESAMPLE) -> np.ndarray:
    """resize_image_by for an H x W (x C) uint8 array and an array method ("antialias", "area").

    The placement's source box must have whole-pixel edges here (an array slice):
    ``place(..., whole_pixels=True)``, except for EXACT_SCALE_METHODS ("dct_sinc"), which
    resample the exact box.
    """
    tx0, ty0, tx1, ty1 = placement.target_box
    if resample_method in EXACT_SCALE_METHODS:  # the box as it is, fractional edges included
        inner = resample_box(pixels, placement.source_box, (tx1 - tx0, ty1 - ty0))
    else:
        left, top, right, bottom = (int(edge) for edge in placement.source_box)
        inner = resample_array(
            np.ascontiguousarray(pixels[top:bottom, left:right]), (tx1 - tx0, ty1 - ty0), resample_method
        )
    if (tx0, ty0, tx1, ty1) == (0, 0, *placement.output_size):
        return inner
    dst_w, dst_h = placement.output_size
    fill = PAD_FILL if pixels.ndim == 3 else PAD_FILL[0]
    canvas = np.empty((dst_h, dst_w, *pixels.shape[2:]), dtype=np.uint8)
    canvas[...] = fill
    canvas[ty0:ty1, tx0:tx1] = inner
    return canvas


def resize_image(
    image: Image.Image,
    target: tuple[int, int],
    resize_mode: str,
    resample_method: str = DEFAULT_RESAMPLE,
    *,
    max_side: int | None = None,
) -> Image.Image:
    """Resizes the upright ``image`` to ``target`` (width, height) by a resize mode: resize_image_by
    with the mode's Placement."""
    whole = cuts_whole_pixels(resample_method)
    placement = place(image.size, target, resize_mode, whole_pixels=whole, max_side=max_side)
    return resize_image_by(image, placement, resample_method)


def resize_pixels(
    pixels: np.ndarray,
    target: tuple[int, int],
    resize_mode: str,
    resample_method: str = DEFAULT_RESAMPLE,
    *,
    max_side: int | None = None,
) -> np.ndarray:
    """resize_image for an H x W (x C) uint8 array and an array method ("antialias", "area"). The
    crop mode's centre box has whole-pixel edges here (an array slice), at most half a source
    pixel off the exact centre."""
    whole = cuts_whole_pixels(resample_method)
    placement = place((pixels.shape[1], pixels.shape[0]), target, resize_mode, whole_pixels=whole, max_side=max_side)
    return resize_pixels_by(pixels, placement, resample_method)

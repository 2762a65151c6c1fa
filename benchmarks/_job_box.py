"""Where the job's stored 224 px crop sits in the source, for a PSNR against a Lanczos resize of
the full decode over that very box (a box half a pixel off costs several dB on sharp photos).

The array methods crop whole pixels of the image as decoded; the DCT-reduced ones (the default)
decode a JPEG at a scale M/8 and keep its whole pixels only (beam_jobs/imaging/decode.py), so the
box is the reduced image's whole-pixel centre box, scaled back by 8/M.
"""

from __future__ import annotations

import io

import simplejpeg
from PIL import Image

from beam_jobs.imaging.geometry import _centre_box  # pylint: disable=protected-access
from beam_jobs.imaging.preprocess import required_source_size
from beam_jobs.imaging.resample import (
    DCT_MARGIN,
    DCT_REDUCED_METHODS,
    EXACT_SCALE_METHODS,
    cuts_whole_pixels,
)

__all__ = ["job_source_box"]


def job_source_box(data: bytes, method: str, size: int = 224) -> tuple[float, float, float, float]:
    """The source box (left, top, right, bottom, in the full decode's pixels) of the crop that
    ``method`` stores for the upright JPEG ``data`` (crop mode, a square output of ``size``)."""
    full = Image.open(io.BytesIO(data)).size
    if method in EXACT_SCALE_METHODS:  # placed on the decode's exact extent: the source's own centre box
        return _centre_box(full, (size, size), whole_pixels=False)
    if method not in DCT_REDUCED_METHODS:
        return _centre_box(full, (size, size), whole_pixels=cuts_whole_pixels(method))
    need = required_source_size(full, (size, size), "crop", margin=DCT_MARGIN)
    rounded_up = simplejpeg.decode_jpeg(data, min_width=need[0], min_height=need[1]).shape[1]
    eighths = next(m for m in range(1, 9) if -(-full[0] * m // 8) == rounded_up)
    reduced = (full[0] * eighths // 8, full[1] * eighths // 8)
    left, top, right, bottom = _centre_box(reduced, (size, size), whole_pixels=True)
    return (left * 8 / eighths, top * 8 / eighths, right * 8 / eighths, bottom * 8 / eighths)

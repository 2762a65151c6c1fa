"""A perceptual signature of an image's bytes: near-copies (re-encoded, resized, slightly cropped,
brightened or blurred) get signatures close to each other, distinct photos far apart.

Three parts of one 144-bit int, all of the upright image reduced to 32x32:

- bits 64-127: the DCT hash ("pHash") of its grey levels: its 8x8 lowest DCT frequencies,
  one bit per frequency above their median. Near-copies are a few bits apart, distinct photos
  about 32.
- bits 0-63: the chromaticity (r and g over r + g + b, each channel's mean plus 16, one
  byte each) of its four quadrants.
  It does not change with brightness, and it tells apart what the grey hash cannot: smooth
  gradients of different colours (a yellow blur and a blue sky hash alike in grey).
- above them, 16 bits of tone: the grey levels' mean (0-255) and the log of their standard
  deviation (steps of 0.025). The grey hash keeps only each frequency's side of the median, so it
  is the same for a white sky and a grey wall, or for a flat wall and a textured one: the tone
  tells those apart. The mean is linear, not a log: a brightness change by a factor of 10% or by
  25 levels moves it by at most 26 levels at any brightness, where in a log a dark photo's shift
  by 25 levels is a large step. Its byte is never 0 (at least 1), so a signature says by its
  width which method made it: ``tone=False`` gives the 128 bits of the method before it
  ("dct64+chroma4"), which the datasets made with it keep for --resume and --append.

The reduction starts in the JPEG decoder (Pillow's ``draft`` decodes at 1/2, 1/4 or 1/8 scale
from the DCT coefficients), so a 500x375 JPEG costs about half a millisecond.
``benchmarks/near_copies.py`` measures recall and false pairs per threshold; docs/leakage.md has
the table, and the variants measured before this one (a 16x16 reduction, 6x6 frequencies, the
coefficients' correlation, the grey hash alone).
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
from PIL import Image, ImageOps

from beam_jobs.imaging.decode import pillow_checks
from beam_jobs.imaging.preprocess import normalize_mode

__all__ = ["perceptual_hash"]

_SIDE = 32
# Added to each channel's mean before the chromaticity: dark quadrants tend to grey instead of
# noise (measured: recall of dark photos' re-encodes 0.902 -> 0.914, no new false pair).
_CHROMA_OFFSET = 16.0
_KEEP = 8
# The tone bytes: the grey levels' mean, and log(std + 2) in steps of 0.025 (the offset keeps a
# flat image's log finite, and its byte within 0-255).
TONE_STEP = 0.025
_STD_OFFSET = 2.0


@lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """The first 8 rows of the 32-point DCT-II matrix. Two small matrix products give the 8x8 low
    frequencies directly, where scipy's full 2-D transform would compute all 32x32 and drop most."""
    k = np.arange(_KEEP)[:, None]
    i = np.arange(_SIDE)[None, :]
    return np.cos(np.pi * (2 * i + 1) * k / (2 * _SIDE)).astype(np.float32)


def perceptual_hash(data: bytes, *, max_pixels: int, tone: bool = True) -> int | None:
    """The image's 144-bit near-copy signature (see the module's docstring; ``tone`` False: the
    128 bits without the tone), or None when the bytes are no image Pillow can decode (or claim
    more than ``max_pixels``): such an input is dead-lettered by its conversion, and an input
    without a signature is in no near-copy group."""
    try:
        # The conversion's own Pillow limit (--max_pixels, not Pillow's default of 179 megapixels):
        # outside it, a scan the conversion takes would have no signature, and its copies no group.
        with pillow_checks(max_pixels), Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > max_pixels:
                return None
            image.draft("RGB", (_SIDE, _SIDE))  # the JPEG decoder's own reduction; a no-op for other formats
            # The converter's own colour policy: 16-bit scaled, never clipped; alpha on white; CMYK.
            upright = normalize_mode(ImageOps.exif_transpose(image), channels=3)
            small = upright.resize((_SIDE, _SIDE), Image.Resampling.BOX)
    except Exception:  # pylint: disable=broad-except  # any undecodable image: no hash, its conversion says why
        return None
    rows = _dct_rows()
    luma = np.asarray(small.convert("L"), dtype=np.float32)
    frequencies = (rows @ luma @ rows.T).ravel()
    luma_hash = int.from_bytes(np.packbits(frequencies > np.median(frequencies)).tobytes(), "big")
    quadrants = np.asarray(small, dtype=np.float32).reshape(2, _SIDE // 2, 2, _SIDE // 2, 3).mean(axis=(1, 3))
    # Regularised: near black, r / (r + g + b) is noise that a re-encode moves by 30 of 255.
    quadrants += _CHROMA_OFFSET
    chromaticity = quadrants[:, :, :2] / quadrants.sum(axis=2, keepdims=True)
    chroma = int.from_bytes(np.round(chromaticity.ravel() * 255).astype(np.uint8).tobytes(), "big")
    signature = luma_hash << 64 | chroma
    if not tone:
        return signature
    levels = [luma.mean(), np.log(luma.std() + _STD_OFFSET) / TONE_STEP]
    mean_byte, std_byte = np.clip(np.round(levels), 1, 255).astype(int)
    return (int(mean_byte) << 8 | int(std_byte)) << 128 | signature

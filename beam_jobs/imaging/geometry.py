"""Where each source pixel goes: one mapping, computed once per image, for pixels and annotations alike.

A resize mode is a map from the upright source to the stored image: a box of the source (all of
it, or the crop mode's centre box) is scaled onto a rectangle of the output (all of it, or the
pad mode's inner rectangle). ``place`` computes that map, and the pixel code (preprocess.py)
resizes by it, while ``map_box`` carries a bounding box through the same numbers. Before this
module the resize code computed its own boxes: an annotation transform written beside it could
disagree with the pixels by a rounding (a half-pixel shift of every box), and nothing would say
so. With one Placement per image, boxes, masks and pixels cannot part.

EXIF orientation comes first (``orient_box``): annotations are given in the frame of the file's
stored pixels, and turn with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KEEP", "Placement", "map_box", "orient_box", "place", "upright_size"]

KEEP = "keep"  # the resize mode that keeps each image at its own size (or shrinks it to --max_side)

Box = tuple[float, float, float, float]  # (left, top, right, bottom), in pixels

# Orientations 5-8 swap width and height when applied.
_TRANSPOSING = frozenset({5, 6, 7, 8})


@dataclass(frozen=True)
class Placement:
    """The map of one image: ``source_box`` of the upright source (pixel edges, possibly
    fractional) is scaled onto ``target_box`` (whole-pixel edges) of an output of
    ``output_size`` (width, height). Output pixels outside target_box are padding."""

    source_box: Box
    target_box: tuple[int, int, int, int]
    output_size: tuple[int, int]

    @property
    def is_identity(self) -> bool:
        """True when the stored image is the upright source itself, pixel for pixel."""
        width, height = self.output_size
        return self.source_box == (0, 0, width, height) and self.target_box == (0, 0, width, height)


def upright_size(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """(width, height) of an image of stored ``size`` once its EXIF orientation is applied."""
    return (size[1], size[0]) if orientation in _TRANSPOSING else size


def orient_box(box: Box, size: tuple[int, int], orientation: int) -> Box:
    """A box in the stored frame of an image of ``size`` (width, height), in the upright frame.

    The same eight transpositions as PIL.ImageOps.exif_transpose (and decode.py's array ones).
    """
    x0, y0, x1, y1 = box
    w, h = size
    if orientation == 2:  # mirror left-right
        return w - x1, y0, w - x0, y1
    if orientation == 3:  # rotate 180
        return w - x1, h - y1, w - x0, h - y0
    if orientation == 4:  # mirror top-bottom
        return x0, h - y1, x1, h - y0
    if orientation == 5:  # transpose
        return y0, x0, y1, x1
    if orientation == 6:  # a quarter turn clockwise: stored (x, y) -> (h - y, x)
        return h - y1, x0, h - y0, x1
    if orientation == 7:  # transverse
        return h - y1, w - x1, h - y0, w - x0
    if orientation == 8:  # a quarter turn anticlockwise: stored (x, y) -> (y, w - x)
        return y0, w - x1, y1, w - x0
    return box


def _centre_box(source: tuple[float, float], target: tuple[int, int], *, whole_pixels: bool) -> Box:
    """The centred box of the source with the target's aspect ratio (the crop mode's), with
    fractional edges, or rounded to whole pixels (at most half a source pixel off-centre)."""
    (src_w, src_h), (dst_w, dst_h) = source, target
    scale = max(dst_w / src_w, dst_h / src_h)
    box_w, box_h = dst_w / scale, dst_h / scale
    if whole_pixels:
        whole_w, whole_h = min(src_w, max(1, round(box_w))), min(src_h, max(1, round(box_h)))
        left, top = (src_w - whole_w) // 2, (src_h - whole_h) // 2
        return left, top, left + whole_w, top + whole_h
    # Clamped: float noise can otherwise put the box a hair outside the image, which Pillow refuses.
    x0, y0 = max(0.0, (src_w - box_w) / 2), max(0.0, (src_h - box_h) / 2)
    return x0, y0, min(float(src_w), x0 + box_w), min(float(src_h), y0 + box_h)


def _fitted_size(source: tuple[float, float], target: tuple[int, int]) -> tuple[int, int]:
    scale = min(target[0] / source[0], target[1] / source[1])
    return max(1, round(source[0] * scale)), max(1, round(source[1] * scale))


def kept_size(source: tuple[int, int], max_side: int | None) -> tuple[int, int]:
    """The keep mode's output size: the source's, or shrunk (aspect ratio kept) so that its longer
    side is ``max_side``; never enlarged."""
    if max_side is None or max(source) <= max_side:
        return source
    return _fitted_size(source, (max_side, max_side))


def place(
    source: tuple[float, float],
    target: tuple[int, int],
    resize_mode: str,
    *,
    whole_pixels: bool = False,
    max_side: int | None = None,
) -> Placement:
    """The Placement of an upright source of size ``source`` for a resize mode (a fractional size:
    a DCT-scaled decode's exact extent; never in the keep mode, whose output has the source's size).

    - crop: the centre box with the target's aspect ratio onto the whole output (``whole_pixels``:
      with whole-pixel edges, as an array slice takes it);
    - pad: the whole source onto the centred rectangle that fits (the rest is padding);
    - stretch: the whole source onto the whole output;
    - keep: the whole source onto an output of its own size, shrunk to ``max_side`` if larger
      (``target`` is not used).
    """
    width, height = source
    whole: Box = (0, 0, width, height)
    if resize_mode == KEEP:
        out = kept_size((round(width), round(height)), max_side)
        return Placement(whole, (0, 0, *out), out)
    dst_w, dst_h = target
    if resize_mode == "crop":
        return Placement(_centre_box(source, target, whole_pixels=whole_pixels), (0, 0, dst_w, dst_h), target)
    if resize_mode == "stretch":
        return Placement(whole, (0, 0, dst_w, dst_h), target)
    if resize_mode == "pad":
        inner_w, inner_h = _fitted_size(source, target)
        left, top = (dst_w - inner_w) // 2, (dst_h - inner_h) // 2
        return Placement(whole, (left, top, left + inner_w, top + inner_h), target)
    raise ValueError(f"unknown resize mode {resize_mode!r}")


def map_box(box: Box, placement: Placement) -> Box | None:
    """A box of the upright source in the stored image's pixels, clipped to the part of the
    output that shows the source; None when nothing of it is left (cut away by the crop)."""
    sx0, sy0, sx1, sy1 = placement.source_box
    tx0, ty0, tx1, ty1 = placement.target_box
    scale_x, scale_y = (tx1 - tx0) / (sx1 - sx0), (ty1 - ty0) / (sy1 - sy0)
    x0 = min(max(tx0 + (box[0] - sx0) * scale_x, tx0), tx1)
    x1 = min(max(tx0 + (box[2] - sx0) * scale_x, tx0), tx1)
    y0 = min(max(ty0 + (box[1] - sy0) * scale_y, ty0), ty1)
    y1 = min(max(ty0 + (box[3] - sy0) * scale_y, ty0), ty1)
    if x1 - x0 <= 0 or y1 - y0 <= 0 or not all(map(math.isfinite, (x0, y0, x1, y1))):
        return None
    return x0, y0, x1, y1

"""Masks through the same map as the pixels (geometry.py), resized nearest-neighbour. Pure.

Two kinds, as TensorFlow Model Garden stores them:
- a semantic mask: one PNG of class ids the size of the image (``image/segmentation/class/encoded``),
  from an input list's ``mask`` file;
- instance masks: one PNG of 0 and 1 per object (``image/object/mask``), from a COCO file's
  polygons or RLE, rasterised by pycocotools as COCO's own tools do.

Nearest-neighbour, so that no class id appears that the source did not hold; the pad mode's
bars are PAD_CLASS (255, the "ignore" id of VOC and Model Garden), never a real class.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
from PIL import Image

from beam_jobs.errors import BadInputError, Stage
from beam_jobs.imaging.geometry import Placement, upright_size

__all__ = ["PAD_CLASS", "encode_mask_png", "instance_mask", "place_mask", "semantic_mask"]

PAD_CLASS = 255
BAD_ANNOTATION = "bad_annotation"

# Labelling tools round: a box's corner or a polygon's point that overshoots the image by up to
# one pixel is taken (COCO itself holds boxes whose x + width is the image width plus a fraction).
# Beyond that it belongs to another image size, and the image is refused rather than its
# annotation silently moved. annotate.py uses it for boxes (it imports this module, not the reverse).
EDGE_TOLERANCE_PX = 1.0
# The frames annotations may be drawn in (--annotation_frame): AUTO tells by the sizes given
# (annotate.drawn_upright).
AUTO, STORED, UPRIGHT = "auto", "stored", "upright"
ANNOTATION_FRAMES = (AUTO, STORED, UPRIGHT)

# The eight EXIF orientations on an H x W array (as decode.py turns the pixels).
_TURNS = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.T,
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a.T[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}


def _upright(
    array: np.ndarray, file_size: tuple[int, int], orientation: int, what: str, frame: str = AUTO
) -> np.ndarray:
    """A mask given in the file's stored frame, or already upright, as an upright array; a mask of
    neither size is refused (it belongs to another image). ``frame`` (--annotation_frame) "auto"
    tells the two by the mask's size, and takes the stored frame when both fit (an input list's
    convention); "stored" or "upright" says which, and a mask not of that frame's size is refused."""
    shape = (array.shape[1], array.shape[0])
    upright = upright_size(file_size, orientation)
    if shape == file_size and frame in (AUTO, STORED):
        return np.ascontiguousarray(_TURNS.get(orientation, lambda a: a)(array))
    if shape == upright and frame in (AUTO, UPRIGHT):
        return array
    raise BadInputError(
        Stage.PREPROCESS,
        BAD_ANNOTATION,
        f"{what} is {shape[0]}x{shape[1]} but its image is {file_size[0]}x{file_size[1]}"
        + (f" ({upright[0]}x{upright[1]} upright)" if upright != file_size else "")
        + ("" if frame == AUTO else f", and --annotation_frame {frame} reads it on the file as {frame}"),
    )


def place_mask(
    mask: np.ndarray, placement: Placement, decoded_size: tuple[float, float], *, fill: int = PAD_CLASS
) -> np.ndarray:
    """An upright full-size mask (H x W uint8) mapped as the pixels were: the placement's source box
    (in the decoded image's pixels, scaled here to the mask's) onto its target box, nearest-neighbour,
    the rest ``fill``."""
    height, width = mask.shape
    scale_x, scale_y = width / decoded_size[0], height / decoded_size[1]
    sx0, sy0, sx1, sy1 = placement.source_box
    box = (sx0 * scale_x, sy0 * scale_y, sx1 * scale_x, sy1 * scale_y)
    tx0, ty0, tx1, ty1 = placement.target_box
    inner = Image.fromarray(mask).resize((tx1 - tx0, ty1 - ty0), Image.Resampling.NEAREST, box=box)
    out_w, out_h = placement.output_size
    if (tx0, ty0, tx1, ty1) == (0, 0, out_w, out_h):
        return np.asarray(inner)
    canvas = np.full((out_h, out_w), fill, np.uint8)
    canvas[ty0:ty1, tx0:tx1] = np.asarray(inner)
    return canvas


def encode_mask_png(mask: np.ndarray) -> bytes:
    """A uint8 mask as a single-channel PNG (the same settings as every PNG the job writes)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8), mode="L").save(buffer, "PNG", compress_level=6)
    return buffer.getvalue()


def semantic_mask(
    data: bytes,
    *,
    file_size: tuple[int, int],
    orientation: int,
    decoded_size: tuple[float, float],
    placement: Placement,
    frame: str = AUTO,
) -> np.ndarray:
    """A semantic mask file (PNG of class ids: mode L, or P whose palette indices are the ids, as
    Pascal VOC's) as the stored image's mask."""
    try:
        image = Image.open(io.BytesIO(data), formats=("PNG",))
        image.load()
    except Exception as error:
        raise BadInputError(Stage.PREPROCESS, BAD_ANNOTATION, f"the mask is not a readable PNG ({error})") from None
    if image.mode not in ("L", "P"):
        raise BadInputError(
            Stage.PREPROCESS,
            BAD_ANNOTATION,
            f"the mask's mode is {image.mode}; a mask is an 8-bit PNG of class ids (mode L, or P as VOC's)",
        )
    array = np.asarray(image, dtype=np.uint8)  # P: the palette indices themselves, never colours
    return place_mask(_upright(array, file_size, orientation, "the mask", frame), placement, decoded_size)


def _compressed_counts(text: str) -> list[int] | None:
    """The run lengths of COCO's compressed RLE string, or None when it is malformed.

    Written here because pycocotools decodes the string only into its C buffer and checks
    nothing: runs that do not add up to the image leave the buffer's tail uninitialised (or write
    past it). This is its format (maskApi.c's rleFrString): each run a little-endian sequence of
    5-bit groups, 48 added to each character, bit 0x20 continuing it and bit 0x10 of the last
    group its sign; from the third run on, each is a difference from the run two before.
    """
    counts: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(text):
                return None
            group = ord(text[position]) - 48
            if not 0 <= group < 64:
                return None
            value |= (group & 0x1F) << shift
            more = bool(group & 0x20)
            position += 1
            shift += 5
            if not more and group & 0x10:
                value |= -1 << shift
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
    return counts


def _whole_numbers(values: object) -> list[int] | None:
    """A list of whole numbers (2 or 2.0; never a boolean) as ints, else None."""
    if not isinstance(values, list):
        return None
    found = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return None
        found.append(int(value))
    return found


def _check_rle(value: object, frame_size: tuple[int, int], ref: str) -> dict:
    """The RLE ``value`` with whole-number counts and size as ints; one whose size is not its
    image's, or whose runs are not whole non-negative numbers that add up to exactly its pixels,
    is refused before pycocotools decodes it (its decode would read or write memory it does not
    own, and store whatever was there)."""
    width, height = frame_size
    if not isinstance(value, dict) or "counts" not in value:
        raise BadInputError(
            Stage.PREPROCESS,
            BAD_ANNOTATION,
            f"{ref}: a segmentation is a list of polygons or an RLE, {{'size': [height, width], 'counts': ...}}",
        )
    size = _whole_numbers(value.get("size"))
    if size is None or len(size) != 2:
        raise BadInputError(
            Stage.PREPROCESS,
            BAD_ANNOTATION,
            f"{ref}: an RLE needs its size as [height, width] (got {value.get('size')!r})",
        )
    if size != [height, width]:
        raise BadInputError(
            Stage.PREPROCESS, BAD_ANNOTATION, f"{ref}: its RLE is {size[1]}x{size[0]}, the image {width}x{height}"
        )
    counts = value["counts"]
    runs = _compressed_counts(counts) if isinstance(counts, str) else _whole_numbers(counts)
    if runs is None:
        problem = "unreadable (a compressed string, or a list of whole numbers)"
    elif any(run < 0 for run in runs):
        problem = "holding a negative run"
    elif sum(runs) != width * height:
        problem = f"runs adding up to {sum(runs)} pixels"
    else:
        return {"size": size, "counts": counts if isinstance(counts, str) else runs}
    raise BadInputError(
        Stage.PREPROCESS,
        BAD_ANNOTATION,
        f"{ref}: its RLE counts are {problem}, not the {width * height} pixels of a {width}x{height} image",
    )


def _check_polygons(polygons: list, ref: str, frame_size: tuple[int, int]) -> None:
    """Each polygon is a flat list of x, y numbers inside the image: an odd count or a non-number is
    refused (pycocotools would drop the last number silently, or fail with an IndexError), and so
    is a point beyond the image's edge by more than EDGE_TOLERANCE_PX (it belongs to another image,
    and pycocotools rasterises the polygon's whole extent: a point at 1e9 takes gigabytes)."""
    width, height = frame_size
    for index, polygon in enumerate(polygons):
        if (
            not isinstance(polygon, list)
            or len(polygon) % 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in polygon)
        ):
            shown = f"{len(polygon)} values" if isinstance(polygon, list) else repr(polygon)[:80]
            raise BadInputError(
                Stage.PREPROCESS,
                BAD_ANNOTATION,
                f"{ref}: segmentation polygon #{index} ({shown}) must be a flat list of x, y numbers",
            )
        for x, y in zip(polygon[::2], polygon[1::2], strict=True):
            tol = EDGE_TOLERANCE_PX
            if not (-tol <= x <= width + tol and -tol <= y <= height + tol):
                raise BadInputError(
                    Stage.PREPROCESS,
                    BAD_ANNOTATION,
                    f"{ref}: segmentation polygon #{index} has the point ({x:g}, {y:g}), outside the image, "
                    f"which is {width}x{height} pixels",
                )


def instance_mask(
    segmentation: str,
    frame_size: tuple[int, int],
    *,
    upright: bool,
    file_size: tuple[int, int],
    orientation: int,
    decoded_size: tuple[float, float],
    placement: Placement,
    ref: str,
) -> np.ndarray:
    """A COCO segmentation (JSON text of polygons or RLE) in a frame of ``frame_size``, as a 0/1
    mask of the stored image."""
    from pycocotools import mask as coco_mask  # pylint: disable=import-outside-toplevel  # only masks need it

    width, height = frame_size
    value = json.loads(segmentation)
    if isinstance(value, list):
        _check_polygons(value, ref, (width, height))
    else:
        value = _check_rle(value, (width, height), ref)
    try:
        if isinstance(value, list):  # polygons
            # One of fewer than 3 points has no area (COCO holds a few): it adds no pixel, as in
            # COCO's own tools, which fail on it instead.
            areas = [polygon for polygon in value if len(polygon) >= 6]
            rles = coco_mask.frPyObjects(areas, height, width) if areas else []
            rle = coco_mask.merge(rles) if rles else None
        elif isinstance(value["counts"], list):  # uncompressed RLE
            rle = coco_mask.frPyObjects(value, height, width)
        else:
            rle = dict(value, counts=value["counts"].encode("ascii"))
        array = np.zeros((height, width), np.uint8) if rle is None else coco_mask.decode(rle).astype(np.uint8)
    except Exception as error:
        raise BadInputError(Stage.PREPROCESS, BAD_ANNOTATION, f"{ref}: unreadable segmentation ({error})") from None
    if array.shape != (height, width):
        raise BadInputError(
            Stage.PREPROCESS,
            BAD_ANNOTATION,
            f"{ref}: its RLE is {array.shape[1]}x{array.shape[0]}, the image {width}x{height}",
        )
    if not array.any():
        # An empty list, or only polygons of fewer than three points: the object would be stored
        # with a mask of nothing, and trained as background, as with no segmentation at all.
        raise BadInputError(
            Stage.PREPROCESS,
            BAD_ANNOTATION,
            f"{ref}: its segmentation covers no pixel of the image, and the dataset holds masks",
        )
    if not upright:
        array = np.ascontiguousarray(_TURNS.get(orientation, lambda a: a)(array))
    del file_size
    return place_mask(array, placement, decoded_size, fill=0)

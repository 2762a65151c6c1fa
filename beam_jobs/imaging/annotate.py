"""Carrying an image's boxes to the stored image, through the same map as its pixels (geometry.py).

Pure: the converter calls ``stored_objects`` with what the decode found (the file's size, its EXIF
orientation, the size it was decoded at) and the Placement it resized the pixels by.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from beam_jobs.errors import BadInputError, Stage
from beam_jobs.imaging.geometry import Placement, map_box, orient_box, upright_size
from beam_jobs.imaging.masks import (
    ANNOTATION_FRAMES,
    AUTO,
    EDGE_TOLERANCE_PX,
    STORED,
    UPRIGHT,
    encode_mask_png,
    instance_mask,
)
from beam_jobs.records import Annotations, BoxObject

__all__ = [
    "ANNOTATION_FRAMES",
    "BAD_ANNOTATION",
    "EDGE_TOLERANCE_PX",
    "StoredObjects",
    "check_boxes_inside",
    "drawn_upright",
    "stored_objects",
]

BAD_ANNOTATION = "bad_annotation"


@dataclass(frozen=True)
class StoredObjects:
    """The objects as the Example stores them: boxes normalised to [0, 1] of the stored image
    (xmin, ymin, xmax, ymax), their class ids and names, crowd flags and areas in stored pixels.
    ``dropped`` counts the boxes that the crop cut away whole."""

    boxes: tuple[tuple[float, float, float, float], ...] = ()
    label_ids: tuple[int, ...] = ()
    label_texts: tuple[str, ...] = ()
    is_crowd: tuple[int, ...] = ()
    areas: tuple[float, ...] = ()
    dropped: int = 0
    masks: tuple[bytes, ...] | None = None  # a 0/1 PNG per object, when the dataset holds instance masks


def _describe(obj: BoxObject) -> str:
    return f"object {obj.ref or obj.label!r} ({obj.label}: {obj.xmin:g},{obj.ymin:g} to {obj.xmax:g},{obj.ymax:g})"


def check_boxes_inside(annotations: Annotations, frame_size: tuple[int, int]) -> None:
    """Refuses (BadInputError ``bad_annotation``) an image with a box beyond its edges by more
    than EDGE_TOLERANCE_PX; ``frame_size`` is the (width, height) the boxes are given in."""
    width, height = frame_size
    for obj in annotations.objects:
        tol = EDGE_TOLERANCE_PX
        if obj.xmin < -tol or obj.ymin < -tol or obj.xmax > width + tol or obj.ymax > height + tol:
            raise BadInputError(
                Stage.PREPROCESS,
                BAD_ANNOTATION,
                f"{_describe(obj)} is outside the image, which is {width}x{height} pixels"
                f"{' upright' if annotations.upright else ' as stored'}",
            )
        # Within the tolerance yet wholly past an edge: clipping would leave no area, and the box
        # would vanish as if a crop had cut it.
        if min(obj.xmax, width) <= max(obj.xmin, 0) or min(obj.ymax, height) <= max(obj.ymin, 0):
            raise BadInputError(
                Stage.PREPROCESS,
                BAD_ANNOTATION,
                f"{_describe(obj)} lies beyond the edge of the image, which is {width}x{height} pixels"
                f"{' upright' if annotations.upright else ' as stored'}",
            )


def drawn_upright(
    declared_size: tuple[int, int] | None, *, file_size: tuple[int, int], orientation: int, frame: str = AUTO
) -> bool:
    """Whether an image's annotations are drawn on it as shown (upright) rather than as stored.

    ``frame`` is the user's word (ANNOTATION_FRAMES). With AUTO, a COCO file's ``declared_size``
    tells: the stored size means the stored frame, the upright size the upright one. EXIF
    orientations 2 to 4 (and 5 to 8 on a square image) turn an image within its own size, so that
    the size cannot tell; reading the boxes in either frame would be a guess that mirrors or turns
    them silently, so the image is refused, naming the flag that says which. An input list gives no
    size: its boxes are as stored (docs/annotations.md), unless the flag says otherwise.
    """
    upright = upright_size(file_size, orientation)
    if declared_size is not None:
        fits = {STORED: declared_size == file_size, UPRIGHT: declared_size == upright}
        if not any(fits.values()) or (frame != AUTO and not fits[frame]):
            width, height = declared_size
            turned = "" if upright == file_size else f" ({upright[0]}x{upright[1]} upright)"
            wanted = "" if frame == AUTO else f", and --annotation_frame {frame} reads them on the file as {frame}"
            raise BadInputError(
                Stage.PREPROCESS,
                BAD_ANNOTATION,
                f"the annotations give the image as {width}x{height}, but the file is {file_size[0]}x{file_size[1]}"
                f"{turned}{wanted}: are they of another image?",
            )
        if frame == AUTO and orientation != 1 and all(fits.values()):
            raise BadInputError(
                Stage.PREPROCESS,
                BAD_ANNOTATION,
                f"the file's EXIF orientation {orientation} turns it within its own size "
                f"({file_size[0]}x{file_size[1]}), so the annotations' width and height cannot tell whether "
                "its boxes are drawn on the image as shown or as stored: say which with "
                "--annotation_frame upright (most labelling tools) or stored",
            )
        if frame == AUTO:
            return fits[UPRIGHT] and not fits[STORED]
    if frame == AUTO:
        return False
    return frame == UPRIGHT


def stored_objects(
    annotations: Annotations,
    *,
    file_size: tuple[int, int],
    orientation: int,
    decoded_size: tuple[float, float],
    placement: Placement,
    frame: str = AUTO,
) -> StoredObjects:
    """The objects of ``annotations`` in the stored image.

    ``file_size`` is the file's (width, height) as stored, ``orientation`` its EXIF orientation,
    ``decoded_size`` the upright size the pixels were decoded at (a JPEG may be decoded at 1/2,
    1/4 or 1/8 scale), and ``placement`` the map the pixels were resized by. A box goes through
    the same steps: turned upright, scaled to the decoded size, then mapped and clipped.
    ``frame`` is the frame the boxes are drawn in (drawn_upright).
    """
    upright = upright_size(file_size, orientation)
    # An image without boxes has nothing a frame could misplace (a kept unannotated COCO image).
    as_upright = bool(annotations.objects) and drawn_upright(
        annotations.declared_size, file_size=file_size, orientation=orientation, frame=frame
    )
    annotations = replace(annotations, upright=as_upright)
    check_boxes_inside(annotations, upright if annotations.upright else file_size)
    scale_x, scale_y = decoded_size[0] / upright[0], decoded_size[1] / upright[1]
    out_w, out_h = placement.output_size
    boxes, ids, texts, crowd, areas = [], [], [], [], []
    with_masks = "instance_masks" in annotations.kinds
    masks: list[bytes] = []
    frame_size = upright if annotations.upright else file_size
    dropped = 0
    for obj, label_id in zip(annotations.objects, annotations.object_ids, strict=True):
        box = (obj.xmin, obj.ymin, obj.xmax, obj.ymax)
        if not annotations.upright:
            box = orient_box(box, file_size, orientation)
        box = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
        mapped = map_box(box, placement)
        if mapped is None:
            dropped += 1
            continue
        x0, y0, x1, y1 = mapped
        if with_masks:
            if obj.segmentation is None:
                raise BadInputError(
                    Stage.PREPROCESS,
                    BAD_ANNOTATION,
                    f"{_describe(obj)} has no segmentation, and the dataset holds masks",
                )
            placed = instance_mask(
                obj.segmentation,
                frame_size,
                upright=annotations.upright,
                file_size=file_size,
                orientation=orientation,
                decoded_size=decoded_size,
                placement=placement,
                ref=obj.ref,
            )
            masks.append(encode_mask_png(placed))
        boxes.append((x0 / out_w, y0 / out_h, x1 / out_w, y1 / out_h))
        ids.append(label_id)
        texts.append(obj.label)
        crowd.append(int(obj.is_crowd))
        areas.append((x1 - x0) * (y1 - y0))
    return StoredObjects(
        tuple(boxes),
        tuple(ids),
        tuple(texts),
        tuple(crowd),
        tuple(areas),
        dropped,
        tuple(masks) if with_masks else None,
    )

"""What `verify` checks in an annotated record: its class ids and names, its boxes, its masks' sizes."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from tfdata_readers.sources.manifest import DatasetInfo

__all__ = ["annotation_problems"]

_SIDES = ("xmin", "ymin", "xmax", "ymax")


def _values(features: Any, key: str) -> list:
    feature = features[key] if key in features else None
    kind = feature.WhichOneof("kind") if feature is not None else None
    return list(getattr(feature, kind).value) if kind else []


def _names_problem(ids: list[int], texts: list[bytes], info: DatasetInfo, what: str) -> str:
    if len(ids) != len(texts):
        return f"{what}: {len(ids)} id(s) but {len(texts)} name(s)"
    for label, text in zip(ids, texts, strict=True):
        if not 0 <= label < min(info.num_classes, len(info.label_names)):
            return f"{what}: id {label}, not in [0, num_classes={info.num_classes})"
        if info.label_names[label] != text.decode(errors="replace"):
            return f"{what}: id {label} is {info.label_names[label]!r} in label_names but the record names it {text!r}"
    return ""


def _png_size(data: bytes) -> tuple[int, int] | str:
    try:
        with Image.open(io.BytesIO(data), formats=("PNG",)) as image:
            return image.size
    except Exception as error:
        return f"not a readable PNG ({error})"


def _values_beyond(data: bytes, allowed: set[int]) -> list[int]:
    """The pixel values of a (readable) mask PNG that are not in ``allowed``, a few at most."""
    with Image.open(io.BytesIO(data), formats=("PNG",)) as image:
        colours = image.getcolors(256) if image.mode in ("L", "P", "1") else None
    # -1 stands for a mask that is not one band of at most 256 values.
    held = {int(value) for _, value in colours if isinstance(value, int)} if colours else {-1}
    return sorted(held - allowed)[:5]


def annotation_problems(features: Any, info: DatasetInfo, size: tuple[int, int]) -> list[str]:
    """How an annotated record (its `features` map, its image `size` (width, height)) disagrees
    with the manifest: class ids out of range or naming another class than the record's text,
    lists of different lengths, boxes outside [0, 1] or with no area, masks of another size
    than the image (or as many instance masks as objects), and instance masks that are not 0/1."""
    found = []
    problem = _names_problem(
        _values(features, "image/class/label"), _values(features, "image/class/text"), info, "image classes"
    )
    if problem:
        found.append(problem)
    if info.task == "detection":
        ids = _values(features, "image/object/class/label")
        problem = _names_problem(ids, _values(features, "image/object/class/text"), info, "objects")
        if problem:
            found.append(problem)
        sides = [_values(features, f"image/object/bbox/{side}") for side in _SIDES]
        lengths = {len(values) for values in sides} | {len(ids)}
        for key in ("image/object/area", "image/object/is_crowd"):
            lengths.add(len(_values(features, key)))
        if len(lengths) > 1:
            found.append(f"object lists of different lengths {sorted(lengths)}")
        else:
            for index, (xmin, ymin, xmax, ymax) in enumerate(zip(*sides, strict=True)):
                if not (0 <= xmin < xmax <= 1 and 0 <= ymin < ymax <= 1):
                    found.append(
                        f"object {index}: box {xmin:g},{ymin:g} to {xmax:g},{ymax:g} is not inside [0, 1] with an area"
                    )
                    break
        if info.raw.get("annotations", {}).get("instance_masks"):
            masks = _values(features, "image/object/mask")
            if len(masks) != len(ids):
                found.append(f"{len(masks)} instance mask(s) for {len(ids)} object(s)")
            for index, png in enumerate(masks):
                got = _png_size(png)
                if got != size:
                    found.append(f"instance mask {index} is {got}, the image {size[0]}x{size[1]}")
                    break
                if values := _values_beyond(png, {0, 1}):
                    found.append(f"instance mask {index} holds {values}, not only 0 and 1")
                    break
    if info.raw.get("annotations", {}).get("semantic_masks"):
        masks = _values(features, "image/segmentation/class/encoded")
        got = _png_size(masks[0]) if masks else "missing"
        if got != size:
            found.append(f"the semantic mask is {got}, the image {size[0]}x{size[1]}")
    return found

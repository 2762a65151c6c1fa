"""An input list row's annotations (several labels, boxes) as the job's Annotations record. Pure.

The schema (docs/annotations.md): ``labels``, the image's classes (a JSON list of text; in CSV,
names separated by ``|``), and ``objects``, its boxes (a JSON list of objects with ``label``,
``xmin``, ``ymin``, ``xmax``, ``ymax`` in pixels of the file as stored, and optionally
``is_crowd``; in CSV, that list as JSON text), and ``mask``, the path of a PNG of class ids the
size of the image (semantic segmentation), relative to the list as the image's is. Every name
goes through the one label policy (names.clean_label), as a tree's folders and the ``label``
column do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from beam_jobs.errors import BadInputError, Reason, Stage
from beam_jobs.listing.names import clean_label
from beam_jobs.records import Annotations, BoxObject

__all__ = ["ANNOTATION_COLUMNS", "annotations_from_row"]

ANNOTATION_COLUMNS = ("labels", "objects", "mask")
_SIDES = ("xmin", "ymin", "xmax", "ymax")
_OBJECT_KEYS = frozenset({*_SIDES, "label", "is_crowd"})


def _bad(where: str, detail: str) -> BadInputError:
    del where  # the dead letter names the row already (its uri is the row's place)
    return BadInputError(Stage.LIST, Reason.BAD_MANIFEST_ROW, detail)


def _labels(value: object, *, where: str, from_csv: bool) -> tuple[str, ...]:
    if from_csv and isinstance(value, str):
        value = [part for part in value.split("|") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad(where, f"labels must be a list of names (got {value!r})"[:300])
    return tuple(sorted({clean_label(item, where=where) for item in value}))


def _number(obj: Mapping, side: str, *, ref: str, where: str) -> float:
    value = obj.get(side)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(where, f"object {ref}: {side} must be a finite number of pixels (got {value!r})")
    return float(value)


def _box_object(obj: object, index: int, *, where: str) -> BoxObject:
    ref = f"#{index}"
    if not isinstance(obj, Mapping):
        raise _bad(where, f"object {ref} must be a JSON object with label, xmin, ymin, xmax and ymax (got {obj!r})")
    unknown = sorted(set(obj) - _OBJECT_KEYS)
    if unknown:
        raise _bad(where, f"object {ref} has unknown keys {unknown}; expected {sorted(_OBJECT_KEYS)}")
    if not isinstance(obj.get("label"), str):
        raise _bad(where, f"object {ref}: label must be text (got {obj.get('label')!r})")
    label = clean_label(obj["label"], where=where)
    xmin, ymin, xmax, ymax = (_number(obj, side, ref=ref, where=where) for side in _SIDES)
    if not (xmin < xmax and ymin < ymax):
        raise _bad(where, f"object {ref} ({label}) is degenerate: {xmin:g},{ymin:g} to {xmax:g},{ymax:g}")
    crowd = obj.get("is_crowd", False)
    if crowd not in (0, 1):  # True and False are 1 and 0
        raise _bad(where, f"object {ref}: is_crowd must be true or false (got {crowd!r})")
    return BoxObject(label, xmin, ymin, xmax, ymax, is_crowd=bool(crowd), ref=f"{where} object {ref}")


def annotations_from_row(row: Mapping, *, where: str, from_csv: bool = False) -> Annotations | None:
    """The row's Annotations, or None when it has neither ``labels`` nor ``objects`` (a one-label row).

    Raises BadInputError (``bad_manifest_row``, naming ``where`` and the object) for a value that
    is not of the schema, a degenerate box (xmin >= xmax or ymin >= ymax), or a bad name. A box
    outside the image is found later, when the image's size is known (annotate.py).
    """
    # An empty CSV cell is no value; a JSON [] is one (an image with no class, or no object). A
    # JSON null is refused: it reads as "none" to one person and "unknown" to another.
    nulls = [c for c in ANNOTATION_COLUMNS if c in row and row[c] is None and not from_csv]
    if nulls:
        raise _bad(where, f"{', '.join(nulls)} is null; write [] for none, or leave the key out")
    present = [c for c in ANNOTATION_COLUMNS if row.get(c) is not None and not (from_csv and row[c] == "")]
    if not present:
        return None
    labels: tuple[str, ...] = ()
    if "labels" in present:
        labels = _labels(row["labels"], where=where, from_csv=from_csv)
    objects: tuple[BoxObject, ...] = ()
    if "objects" in present:
        value = row["objects"]
        if from_csv and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as error:
                raise _bad(where, f"objects must be a JSON list (invalid JSON: {error})") from None
        if not isinstance(value, list):
            raise _bad(where, f"objects must be a list (got {value!r})"[:300])
        objects = tuple(_box_object(obj, index, where=where) for index, obj in enumerate(value))
    return Annotations(labels=labels, objects=objects)  # a mask's path is resolved with the image's (discover.py)

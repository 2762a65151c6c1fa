"""A COCO annotation file as the job's inputs: images with their boxes, joined by image id in Beam.

COCO files reach hundreds of MB (LVIS's train file is over 1 GB), so the file is never loaded
whole: ijson streams its ``images`` and ``annotations`` arrays one item at a time, and the join
of annotations to their image is a CoGroupByKey, spread over the workers like any other
grouping. Only ``categories`` (a few hundred items at most) becomes a side input.

Every annotation that cannot be used is a dead letter naming its id and the file, never fixed
silently: one without a usable ``bbox`` (missing, not four numbers, no area), one whose
``category_id`` is not in ``categories``, or whose ``image_id`` names no image. An image that one
of its annotations cannot describe is refused with it (its other boxes alone would teach a
detector that the object is background). Boxes outside the image are found once the image's size
is known, by the converter (annotate.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.errors import BadInputError, JobError, Reason, Stage
from beam_jobs.listing.discover import IGNORED, LISTING
from beam_jobs.listing.names import clean_label
from beam_jobs.paths import redact, resolve_inside_root
from beam_jobs.records import Annotations, BoxObject, DeadLetter, InputFile
from beam_jobs.spec import parse_coco_split_files  # noqa: F401 (its public name here, too)

__all__ = ["ListCoco", "coco_image_input", "parse_coco_split_files"]


def _stream(uri: str, prefix: str) -> Iterator[Any]:
    import ijson  # pylint: disable=import-outside-toplevel  # only COCO runs need it

    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            yield from ijson.items(handle, prefix, use_float=True)
    except ijson.JSONError as error:
        # The parser's message spans several lines (a snippet and a caret): its first is the verdict.
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise JobError(f"the COCO file {redact(uri)} is not valid JSON: {reason}") from None


def _id_key(value: object) -> object:
    """The join key of an image id: COCO's ids are integers, and an exporter that writes one as
    text ("77") or as 77.0 in one array and as 77 in the other still names the same image. Any
    other id (text that is no number) is its own key, so that it joins only to itself."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _keyed_images(uri: str) -> Iterator[tuple[object, dict]]:
    for image in _stream(uri, "images.item"):
        yield (
            _id_key(image.get("id")),
            {"file_name": image.get("file_name"), "width": image.get("width"), "height": image.get("height")},
        )


def _keyed_annotations(uri: str, *, masks: bool) -> Iterator[tuple[object, dict]]:
    count = segmented = 0
    for annotation in _stream(uri, "annotations.item"):
        count += 1
        segmentation = annotation.pop("segmentation", None)  # never carried when masks are not asked for
        if masks and segmentation is not None:
            segmented += 1
            annotation["segmentation"] = json.dumps(segmentation, separators=(",", ":"))
        yield _id_key(annotation.get("image_id")), annotation
    if masks and count and not segmented:
        # Asked for masks, a file with none would give a dataset without them, and no word of it.
        raise JobError(
            f"--coco_masks: none of the {count} annotations of the COCO file {redact(uri)} has a "
            "segmentation; leave --coco_masks out to convert its boxes alone"
        )
    if not count:
        # A misspelt "annotation" key reads as no array at all: refused, never a dataset of no boxes.
        raise JobError(
            f"the COCO file {redact(uri)} has no annotations (its top-level 'annotations' array is missing "
            "or empty); to convert images without boxes, list them as a folder tree or an input list"
        )


def _categories(uri: str) -> dict:
    """id -> name. Two categories with one id, or one name, would merge two classes (or let the
    last win), so either refuses the file."""
    found: dict = {}
    names: dict = {}
    for category in _stream(uri, "categories.item"):
        ident, name = category.get("id"), category.get("name")
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise JobError(f"the COCO file {redact(uri)}: category id {ident!r} ({name!r}) is not an integer")
        if not isinstance(name, str) or not name.strip():
            raise JobError(f"the COCO file {redact(uri)}: category {ident} has no name (got {name!r})")
        if ident in found:
            raise JobError(
                f"the COCO file {redact(uri)}: category id {ident} is listed twice ({found[ident]!r}, {name!r})"
            )
        try:
            key = clean_label(name, where=f"{redact(uri)} category {ident}")
        except BadInputError as error:  # a class name no dataset can hold refuses the file, as above
            raise JobError(f"the COCO file {redact(uri)}: {error.detail}") from None
        if key in names:
            raise JobError(
                f"the COCO file {redact(uri)}: categories {names[key]} and {ident} have one name {name!r}; "
                "a class is its name, so they would merge"
            )
        found[ident], names[key] = name, ident
    if not found:
        raise JobError(f"the COCO file {redact(uri)} has no categories")
    return found


def _box(annotation: dict, categories: dict, where: str) -> BoxObject:
    ref = f"annotation {annotation.get('id')!r} of {where}"
    category = annotation.get("category_id")
    if isinstance(category, float) and category.is_integer():
        category = int(category)
    # true == 1 in Python: a boolean would find category 1 and be stored as its class.
    name = None if isinstance(category, bool) or not isinstance(category, int) else categories.get(category)
    if name is None:
        raise BadInputError(
            Stage.LIST,
            Reason.BAD_MANIFEST_ROW,
            f"{ref}: category_id {annotation.get('category_id')!r} is not in categories",
        )
    bbox = annotation.get("bbox")
    if (
        not isinstance(bbox, list)
        or len(bbox) != 4
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)
    ):
        raise BadInputError(
            Stage.LIST, Reason.BAD_MANIFEST_ROW, f"{ref}: bbox must be [x, y, width, height] (got {bbox!r})"
        )
    x, y, w, h = (float(v) for v in bbox)
    if w <= 0 or h <= 0:
        raise BadInputError(Stage.LIST, Reason.BAD_MANIFEST_ROW, f"{ref}: bbox {bbox!r} has no area")
    label = clean_label(str(name), where=ref)
    crowd = annotation.get("iscrowd", 0)
    if crowd not in (0, 1):  # the text "0" is refused: bool("0") is True
        raise BadInputError(Stage.LIST, Reason.BAD_MANIFEST_ROW, f"{ref}: iscrowd must be 0 or 1 (got {crowd!r})")
    segmentation = annotation.get("segmentation")
    return BoxObject(
        label, x, y, x + w, y + h, is_crowd=bool(crowd), ref=ref, segmentation=segmentation, category_id=category
    )


def _integral(value: object) -> int | None:
    """A positive whole number of pixels (640 or 640.0) as an int, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) and value > 0 else None


def _id_order(annotation: dict) -> tuple:
    """An image's annotations in id order, numbers by value and any other ids after them; two with
    one id (or none) by their content, so that the order never depends on the runner's."""
    ident = annotation.get("id")
    content = json.dumps(annotation, sort_keys=True, default=str)
    if isinstance(ident, int) and not isinstance(ident, bool):
        return (0, ident, "", content)
    return (1, 0, str(ident), content)


def coco_image_input(
    joined: tuple[Any, dict[str, list]],
    categories: dict,
    *,
    root: str,
    where: str,
    split: str | None,
    keep_empty: bool,
    allow_outside_root: bool = False,
) -> Iterable[InputFile | DeadLetter]:
    """One image of the COCO file with its annotations (a CoGroupByKey's element) as an input, or
    dead letters. Pure."""
    image_id, groups = joined
    images, annotations = groups["images"], groups["annotations"]
    if not images:
        for annotation in annotations:
            yield DeadLetter(
                f"{where}: annotation {annotation.get('id')!r}",
                Stage.LIST,
                Reason.BAD_MANIFEST_ROW,
                f"image_id {image_id!r} names no image of the file",
            )
        return
    if len(images) > 1:
        yield DeadLetter(
            f"{where}: image {image_id!r}",
            Stage.LIST,
            Reason.BAD_MANIFEST_ROW,
            f"image id {image_id!r} is listed {len(images)} times",
        )
        return
    image = images[0]
    name = image.get("file_name")
    if not isinstance(name, str) or not name:
        yield DeadLetter(
            f"{where}: image {image_id!r}", Stage.LIST, Reason.BAD_MANIFEST_ROW, f"no file_name (got {name!r})"
        )
        return
    if not annotations and not keep_empty:
        return
    try:
        # An absolute path or URL is taken as it is (and refused outside the root unless allowed),
        # never glued onto the root.
        entry = name if name.startswith("/") or "://" in name else root + name
        uri, filename = resolve_inside_root(entry, root, allow_outside=allow_outside_root)
        # In id order (the join's order is the runner's).
        ordered = sorted(annotations, key=_id_order)
        objects = tuple(_box(a, categories, where) for a in ordered)
    except BadInputError as error:
        yield DeadLetter(entry, error.stage, error.reason, error.detail)
        return
    width, height = _integral(image.get("width")), _integral(image.get("height"))
    if not (width and height):
        # COCO requires them, and they tell the frame the boxes are drawn in (annotate.py): without
        # them a turned image's boxes would be read in a guessed frame.
        yield DeadLetter(
            entry,
            Stage.LIST,
            Reason.BAD_MANIFEST_ROW,
            f"image {image_id!r}: width and height must be positive whole numbers of pixels "
            f"(got {image.get('width')!r}, {image.get('height')!r})",
        )
        return
    annotations_record = Annotations(objects=objects, declared_size=(width, height))
    yield InputFile(
        filename=filename, uri=uri, split=split, origin=f"{where}: image {image_id!r}", annotations=annotations_record
    )


class ListCoco(beam.PTransform):
    """COCO annotation files -> InputFile | DeadLetter, streamed and joined in the pipeline."""

    def __init__(
        self,
        files: list[tuple[str | None, str]],
        *,
        root: str,
        keep_empty: bool,
        allow_outside_root: bool = False,
        masks: bool = False,
        with_ignored: bool = False,
    ) -> None:
        super().__init__()
        self._with_ignored = with_ignored  # shaped as ListTree's output: {LISTING, IGNORED (empty)}
        self._masks = masks  # keep each annotation's segmentation, for its instance mask
        self._files = files
        self._root = root.rstrip("/") + "/"
        self._keep_empty = keep_empty
        self._allow_outside_root = allow_outside_root

    @no_annotations
    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection | dict[str, beam.PCollection]:
        """Streams each file's images and annotations, joins them by image id, and makes the inputs."""
        parts = []
        for index, (split, uri) in enumerate(self._files):
            files = pipeline | f"CocoFile{index}" >> beam.Create([uri])
            categories = files | f"Categories{index}" >> beam.Map(_categories)
            images = files | f"StreamImages{index}" >> beam.FlatMap(_keyed_images)
            annotations = (
                files
                | f"StreamAnnotations{index}" >> beam.FlatMap(_keyed_annotations, masks=self._masks)
                | f"SpreadAnnotations{index}" >> beam.Reshuffle()
            )
            parts.append(
                {"images": images, "annotations": annotations}
                | f"JoinByImageId{index}" >> beam.CoGroupByKey()
                | f"CocoInputs{index}"
                >> beam.FlatMap(
                    coco_image_input,
                    beam.pvalue.AsSingleton(categories),
                    root=self._root,
                    where=redact(uri),
                    split=split,
                    keep_empty=self._keep_empty,
                    allow_outside_root=self._allow_outside_root,
                )
            )
        listing = tuple(parts) | "CocoListing" >> beam.Flatten()
        if not self._with_ignored:
            return listing
        # A COCO file names its images one by one: nothing is left out on purpose.
        return {LISTING: listing, IGNORED: pipeline | "NothingIgnored" >> beam.Create([])}

"""The small, picklable records that flow between the job's stages (paths and stats, never pixels)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace

from beam_jobs.paths import redact

__all__ = [
    "Annotations",
    "BoxObject",
    "DeadLetter",
    "InputFile",
    "ShardResult",
    "annotation_digest",
    "class_names",
    "content_label",
]


@dataclass(frozen=True, order=True)
class BoxObject:
    """One object of an image: a class name and a box in source pixels (edges, left < right, top < bottom).

    The box is in the frame of the file's stored pixels (before its EXIF orientation) unless the
    image's Annotations say ``upright``. ``ref`` names it in messages (a COCO annotation id, or
    the list row and position).
    """

    label: str
    xmin: float
    ymin: float
    xmax: float
    ymax: float
    is_crowd: bool = False
    ref: str = ""
    segmentation: str | None = None  # COCO polygons or RLE, as JSON text, in the boxes' frame
    category_id: int | None = None  # a COCO file's own id of the class (the manifest maps names to them)


@dataclass(frozen=True, order=True)
class Annotations:
    """What an input list (or a COCO file) says about one image beyond a single class label.

    ``labels``: the image's classes (multi-label), sorted and distinct. ``objects``: its boxes.
    ``upright``: the boxes are in the frame of the image as shown (its EXIF orientation applied)
    rather than as stored; a COCO file whose width and height are those of the upright image says
    so. ``label_ids`` and each object's id are filled in by the plan from the dataset's label names.
    """

    labels: tuple[str, ...] = ()
    objects: tuple[BoxObject, ...] = ()
    upright: bool = False
    # (width, height) the annotation file gives the image (COCO's): the converter checks it against
    # the file, and reads the boxes as upright when it is the size of the image as shown.
    declared_size: tuple[int, int] | None = None
    mask_uri: str | None = None  # a semantic mask: a PNG of class ids the size of the image
    # What the dataset's annotated inputs hold ("labels", "objects", "mask", "instance_masks"),
    # set by the plan: every example of a dataset then has the same keys, and an input that lacks
    # what its dataset holds (a mask) is refused rather than written without it.
    kinds: tuple[str, ...] = ()
    label_ids: tuple[int, ...] = ()
    object_ids: tuple[int, ...] = ()

    def content(self) -> tuple:
        """What the annotations say, without where they were said (each object's ``ref``): two
        rows that list one image with equal content agree."""
        return (
            self.labels,
            tuple(replace(o, ref="") for o in self.objects),
            self.upright,
            self.declared_size,
            self.mask_uri,
        )

    def digest(self) -> str:
        """A short hash of ``content()``, as a shard's sidecar records it for --append to compare."""
        return hashlib.sha256(repr(self.content()).encode("utf-8")).hexdigest()[:32]

    def own_kinds(self) -> tuple[str, ...]:
        """What this input's annotations hold (the plan's ``kinds`` is the union over the dataset)."""
        kinds = {"labels"} if self.labels else set()
        if self.objects:
            kinds.add("objects")
        if any(o.segmentation is not None for o in self.objects):
            kinds.add("instance_masks")
        if self.mask_uri is not None:
            kinds.add("mask")
        return tuple(sorted(kinds))

    def names(self) -> tuple[str, ...]:
        """Every class name the image carries, sorted and distinct."""
        return tuple(sorted({*self.labels, *(o.label for o in self.objects)}))

    def with_ids(self, ids: dict[str, int]) -> Annotations:
        """The same annotations with the dataset's class ids filled in."""
        return replace(
            self,
            label_ids=tuple(ids[name] for name in self.labels),
            object_ids=tuple(ids[o.label] for o in self.objects),
        )


# InputFile.phash of an input hashed for --split_groups whose bytes gave no signature (no image
# Pillow decodes): its example then holds an empty signature, and it is in no near-copy group.
NO_SIGNATURE = -1


@dataclass(frozen=True, order=True)
class InputFile:
    """One listed input.

    ``filename`` is the path relative to the input root ("cat/001.jpg"); it names the input in the
    output, and its hash decides the split (when none is given) and the shard. ``label`` and
    ``split`` are None until known. ``size`` and ``mtime`` (seconds) are None when the listing
    did not tell them.
    """

    filename: str
    uri: str
    label: str | None = None
    split: str | None = None
    size: int | None = None
    label_id: int = -1
    content_sha256: str | None = None
    mtime: float | None = None
    origin: str | None = None  # where an input list named it ("list.csv:12"), for messages
    annotations: Annotations | None = None  # multi-label or boxes, from an input list or a COCO file
    # --split_groups: the perceptual signature of the upright image (None: not hashed; NO_SIGNATURE: no image),
    # the user's group (an input list's group column, or --group_pattern's capture), and the id of
    # the split group planning put it in (None: a group of its own).
    phash: int | None = None
    user_group: str | None = None
    split_group: str | None = None


def annotation_digest(f: InputFile) -> str | None:
    """What an input's annotations say, as a short hash (None without annotations): --append
    compares it with the one recorded when the input was converted. A one-label row of an
    annotated dataset is planned with empty annotations, and says nothing more than a row without
    any: both are None, so that the row is held, not "changed", by the next append."""
    if f.annotations is None or f.annotations.content() == Annotations().content():
        return None
    return f.annotations.digest()


def class_names(f: InputFile) -> tuple[str, ...]:
    """The class names an input counts for: its label, and every class its annotations name.

    One rule for the label names, the class counts and the plan, whatever the task: a
    classification input counts for its one label, a multi-label or detection input for each
    class it shows (an image with no object counts for none).
    """
    if f.annotations is None:
        return (f.label,) if f.label is not None else ()
    names = set(f.annotations.names())
    if f.label is not None:
        names.add(f.label)
    return tuple(sorted(names))


def content_label(f: InputFile) -> str:
    """The label a content key records, and that an append compares with the version's: its one
    label, or an annotated input's classes joined ("cat+dog") where it has none. Two inputs with
    identical bytes and equal content labels are one image stored twice; with different ones, one
    image taught two labels."""
    if f.label is not None:
        return f.label
    return "+".join(class_names(f))


@dataclass(frozen=True, order=True)
class DeadLetter:
    """An input the job could not use: one line of dead_letters.jsonl."""

    uri: str
    stage: str
    reason: str
    detail: str = ""

    def to_json(self) -> dict:
        """The dead-letter line, with secrets (signed-URL query strings, passwords) removed."""
        return {key: redact(value) for key, value in asdict(self).items()}


@dataclass(frozen=True, order=True)
class ShardResult:
    """What one written shard holds, for dataset_info.json.

    ``class_counts`` and ``dead_letters_by_reason`` are sorted (name, count) pairs: the per-split
    class histogram and dead-letter table are sums of these, so no step re-reads the shards.
    """

    split: str
    index: int
    num_shards: int
    file: str
    num_examples: int
    bytes: int
    sha256: str
    class_counts: tuple[tuple[str, int], ...] = ()
    dead_letters_by_reason: tuple[tuple[str, int], ...] = ()
    object_counts: tuple[tuple[str, int], ...] = ()  # annotated: objects stored per class
    objects_cut: int = 0  # annotated: objects the crop cut away whole
    mask_ids: tuple[int, ...] = ()  # semantic masks: the class ids they hold

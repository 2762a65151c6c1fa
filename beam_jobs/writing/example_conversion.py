"""The per-image transformation, pure: one source's bytes (and its mask's) to one serialized Example."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import numpy as np

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError, Stage
from beam_jobs.imaging.annotate import BAD_ANNOTATION, StoredObjects, stored_objects
from beam_jobs.imaging.decode import NEAREST_EIGHTH, DecodedImage, DecodedPixels, decode_image, decode_rgb_pixels
from beam_jobs.imaging.example import ExampleFields, encode_array, encode_pixels, serialize_example, source_id_for
from beam_jobs.imaging.geometry import Placement, place
from beam_jobs.imaging.masks import encode_mask_png, semantic_mask
from beam_jobs.imaging.preprocess import normalize_mode, required_source_size, resize_image_by, resize_pixels_by
from beam_jobs.imaging.resample import (
    ARRAY_METHODS,
    DCT_MARGIN,
    DCT_REDUCED_METHODS,
    EXACT_SCALE_METHODS,
    cuts_whole_pixels,
)
from beam_jobs.records import NO_SIGNATURE, InputFile

__all__ = ["ExampleClasses", "convert_image"]


@dataclass(frozen=True)
class ExampleClasses:
    """What an annotated example holds, for the manifest's counts: its classes (image level),
    the class of each object it keeps, how many objects the crop cut away, and the ids its mask
    holds (a mask's ids are the user's own numbers, so the manifest records the ones seen)."""

    classes: tuple[str, ...]
    objects: tuple[str, ...]
    dropped: int
    mask_ids: tuple[int, ...] = ()  # the class ids its semantic mask holds


class _StoredImage(NamedTuple):
    """An image as the example stores it, with what its decode found and where the stored image
    sits in the decoded one: the annotations and the mask are placed by them."""

    decoded: DecodedImage | DecodedPixels
    decoded_size: tuple[float, float]  # the decoded image's size (DecodedPixels.extent where it has one)
    placement: Placement
    encoded: bytes


def convert_image(
    data: bytes, input_file: InputFile, config: ImageConfig, mask: bytes | None = None
) -> tuple[bytes, list[str], str, ExampleClasses | None]:
    """The whole per-image transformation, pure: source bytes (and its semantic mask's, when it
    has one) to serialized Example bytes.

    Returns (serialized example, events worth counting, sha256 of the source bytes, and for an
    annotated input the classes and objects the example holds). Raises BadInputError for
    unusable input.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    stored = _store_image(data, config)
    events = list(stored.decoded.events)
    fields = _example_fields(stored, input_file, config, sha256)
    classes = None
    if input_file.annotations is not None:
        fields, classes = _with_annotations(fields, stored, input_file, config, mask)
        events += ["object_cut_by_crop"] * classes.dropped
    else:
        assert input_file.label is not None, "a planned input has its label or its annotations"
    return serialize_example(fields), events, sha256, classes


def _store_image(data: bytes, config: ImageConfig) -> _StoredImage:
    """Decodes, places and encodes the image as ``config`` asks, on the numpy path where its
    resampling has one (decode.py, resample.py), else with Pillow."""
    method = config.resample_method
    draft_size_for = partial(
        required_source_size,
        target=config.size,
        resize_mode=config.resize_mode,
        max_side=config.max_side,
        margin=DCT_MARGIN if method in DCT_REDUCED_METHODS else 1.0,
    )
    if method in ARRAY_METHODS and (config.channels == 3 or config.decodes_luma):
        return _store_as_arrays(data, config, draft_size_for)
    return _store_with_pillow(data, config, draft_size_for)


def _store_as_arrays(
    data: bytes, config: ImageConfig, draft_size_for: Callable[[tuple[int, int]], tuple[int, int]]
) -> _StoredImage:
    """The fast path: numpy arrays from decode to encode."""
    method = config.resample_method
    fast = decode_rgb_pixels(
        data,
        max_pixels=config.max_pixels,
        draft_size_for=draft_size_for,
        normalize=partial(normalize_mode, channels=config.channels),
        any_dct_scale=(NEAREST_EIGHTH if method in EXACT_SCALE_METHODS else True)
        if method in DCT_REDUCED_METHODS
        else False,
        channels=config.channels,
    )
    decoded_size: tuple[float, float] = (fast.pixels.shape[1], fast.pixels.shape[0])
    if fast.extent is not None and not config.keeps_size:
        # What the pixels show of the source, exactly (a part-pixel rounded makes it a fraction):
        # placed by the array's own size, the image would be shrunk or stretched by that fraction.
        decoded_size = fast.extent
    placement = place(
        decoded_size, config.size, config.resize_mode, whole_pixels=cuts_whole_pixels(method), max_side=config.max_side
    )
    if _stored_as_is(fast, decoded_size, placement, config):
        return _StoredImage(fast, decoded_size, placement, data)
    pixels = resize_pixels_by(fast.pixels, placement, method)
    encoded = encode_array(pixels, encoding=config.encoding, jpeg_quality=config.jpeg_quality)
    return _StoredImage(fast, decoded_size, placement, encoded)


def _store_with_pillow(
    data: bytes, config: ImageConfig, draft_size_for: Callable[[tuple[int, int]], tuple[int, int]]
) -> _StoredImage:
    """Pillow's path: any channel count, and the resamplings numpy has not."""
    decoded = decode_image(data, max_pixels=config.max_pixels, draft_size_for=draft_size_for)
    image = normalize_mode(decoded.image, channels=config.channels)
    decoded_size = image.size
    placement = place(decoded_size, config.size, config.resize_mode, max_side=config.max_side)
    if _stored_as_is(decoded, decoded_size, placement, config):
        return _StoredImage(decoded, decoded_size, placement, data)
    image = resize_image_by(image, placement, config.resample_method)
    encoded = encode_pixels(image, encoding=config.encoding, jpeg_quality=config.jpeg_quality)
    return _StoredImage(decoded, decoded_size, placement, encoded)


def _example_fields(stored: _StoredImage, input_file: InputFile, config: ImageConfig, sha256: str) -> ExampleFields:
    """The fields every example has: the stored image, its size and format, and who it is."""
    width, height = stored.placement.output_size
    return ExampleFields(
        encoded=stored.encoded,
        format=config.format_name,
        height=height,
        width=width,
        channels=config.channels,
        label=input_file.label_id,
        label_text=input_file.label or "",
        filename=input_file.filename,
        sha256=sha256,
        source_id=source_id_for(input_file.filename),
        near_copy_signature=_signature_bytes(input_file.phash),
    )


def _signature_bytes(phash: int | None) -> bytes | None:
    """18 bytes (16 for a signature of the legacy method, which has no tone bytes: a tone's
    first byte is never 0); empty for an input with no signature."""
    if phash is None:
        return None
    return b"" if phash == NO_SIGNATURE else phash.to_bytes(18 if phash >> 128 else 16, "big")


def _with_annotations(
    fields: ExampleFields, stored: _StoredImage, input_file: InputFile, config: ImageConfig, mask: bytes | None
) -> tuple[ExampleFields, ExampleClasses]:
    """An annotated input's fields: its classes, its objects placed on the stored image and, for
    a dataset with masks, its semantic mask; with what they hold, for the manifest's counts."""
    annotations = input_file.annotations
    assert annotations is not None
    objects = stored_objects(
        annotations,
        file_size=stored.decoded.source_size,
        orientation=stored.decoded.orientation,
        decoded_size=stored.decoded_size,
        placement=stored.placement,
        frame=config.annotation_frame,
    )
    ids = _image_classes(input_file, objects)
    fields = replace(fields, labels=tuple(ids), label_texts=tuple(ids.values()), objects=objects)
    mask_ids: tuple[int, ...] = ()
    if "mask" in annotations.kinds:
        placed = _semantic_mask(mask, stored, config.annotation_frame)
        mask_ids = tuple(int(i) for i in np.unique(placed))
        fields = replace(fields, segmentation_png=encode_mask_png(placed))
    return fields, ExampleClasses(tuple(ids.values()), tuple(objects.label_texts), objects.dropped, mask_ids)


def _semantic_mask(mask: bytes | None, stored: _StoredImage, frame: str) -> np.ndarray:
    """The stored image's semantic mask (class ids, the stored image's size); an input of a
    dataset with masks that has none is refused (its example would be trained as all background)."""
    if mask is None:
        raise BadInputError(
            Stage.PREPROCESS, BAD_ANNOTATION, "no mask: the other inputs of this dataset have one (the mask column)"
        )
    return semantic_mask(
        mask,
        file_size=stored.decoded.source_size,
        orientation=stored.decoded.orientation,
        decoded_size=stored.decoded_size,
        placement=stored.placement,
        frame=frame,
    )


def _image_classes(input_file: InputFile, objects: StoredObjects) -> dict[int, str]:
    """The image-level classes of an annotated example, id -> name in id order: its label, its
    listed labels, and the class of each object the stored image still shows."""
    annotations = input_file.annotations
    assert annotations is not None
    ids = dict(zip(annotations.label_ids, annotations.labels, strict=True))
    ids.update(zip(objects.label_ids, objects.label_texts, strict=True))
    if input_file.label is not None:
        ids[input_file.label_id] = input_file.label
    return dict(sorted(ids.items()))


def _stored_as_is(
    decoded: DecodedImage | DecodedPixels, decoded_size: tuple[float, float], placement: Placement, config: ImageConfig
) -> bool:
    """True when the keep mode may store the source file's own bytes: a JPEG, to be stored as JPEG,
    already upright, in the colour mode asked for, decoded and kept at full size. Anything else is
    re-encoded from the pixels (a reader would otherwise see it sideways, or in CMYK)."""
    return (
        config.keeps_size
        and config.encoding == "jpeg"
        and decoded.source_format == "JPEG"
        and decoded.orientation == 1
        and decoded.source_mode == ("RGB" if config.channels == 3 else "L")
        and decoded_size == decoded.source_size
        and placement.is_identity
    )

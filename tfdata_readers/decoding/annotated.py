"""Decoding and augmenting an annotated example: pixels, boxes and mask moved by one window and one flip.

As in the converter (geometry.py), one map per example is computed once and applied to
everything: a random crop window (training), then a resize of that window to the model's size,
then a flip. Boxes are normalised (ymin, xmin, ymax, xmax), so the resize does not change them;
the window re-clips them, and a box left with no area is dropped (and counted). The semantic mask
is cropped by the same window and resized nearest-neighbour, so no class id appears that the
stored mask did not hold. Every random choice is a stateless function of the example's seed.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfdata_readers.config import PILLOWS_DCT_METHOD, JpegDctMethod
from tfdata_readers.decoding.decode import decode_image
from tfdata_readers.sources.manifest import ImageInfo

__all__ = ["annotated_element", "crop_boxes"]


def crop_boxes(boxes: tf.Tensor, window: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Boxes [N, 4] (normalised to the image) in the crop `window` ([ymin, xmin, ymax, xmax],
    normalised), clipped to it; returns (the boxes with area left, their indices)."""
    top, left, bottom, right = tf.unstack(window)
    height, width = bottom - top, right - left
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=1)
    moved = tf.stack(
        [(ymin - top) / height, (xmin - left) / width, (ymax - top) / height, (xmax - left) / width], axis=1
    )
    clipped = tf.clip_by_value(moved, 0.0, 1.0)
    keep = tf.logical_and(clipped[:, 2] > clipped[:, 0], clipped[:, 3] > clipped[:, 1])
    indices = tf.cast(tf.reshape(tf.where(keep), [-1]), tf.int32)
    return tf.gather(clipped, indices), indices


def annotated_element(
    encoded: tf.Tensor,
    seed: tf.Tensor,
    image: ImageInfo,
    boxes: tf.Tensor,
    *,
    out_size: tuple[int, int],
    training: bool,
    mask_png: tf.Tensor | None = None,
    instance_pngs: tf.Tensor | None = None,
    size: tf.Tensor | None = None,
    area_range: tuple[float, float] = (0.3, 1.0),
    aspect_ratio_range: tuple[float, float] = (0.5, 2.0),
    min_object_covered: float = 0.3,
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> dict[str, tf.Tensor]:
    """One annotated example at `out_size`: in evaluation the whole image; in training a random crop
    that covers at least `min_object_covered` of one of its objects (the whole image when it has
    none that fits), then a left-right flip half the time.

    Returns `pixels` (float32 [h, w, C]), `boxes` (the kept ones, [K, 4]), `kept` (int32 [K]: which
    of the stored boxes they are), `dropped` (int32: how many the crop cut away) and `mask` (uint8
    [h, w, 1], or [0, 0, 1] without one), and with `instance_pngs` (a PNG per stored object)
    `instance_masks` (uint8 [K, h, w], the kept objects' masks, moved as their boxes are)."""
    pixels = decode_image(encoded, image, size, dct_method=dct_method)
    count = tf.shape(boxes)[0]
    layers = _Layers(
        pixels=pixels,
        mask=None if mask_png is None else tf.io.decode_png(mask_png, channels=1),
        instances=None if instance_pngs is None else _decode_instances(instance_pngs, tf.shape(pixels)),
        boxes=boxes,
        kept=tf.range(count, dtype=tf.int32),
    )
    if training:
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        layers = _random_crop(
            layers,
            crop_seed,
            area_range=area_range,
            aspect_ratio_range=aspect_ratio_range,
            min_object_covered=min_object_covered,
        )
    layers = _resized(layers, out_size)
    if training:
        layers = _random_flip(layers, flip_seed)
    return {
        "pixels": tf.ensure_shape(layers.pixels, (*out_size, image.channels)),
        "boxes": layers.boxes,
        "kept": layers.kept,
        "dropped": count - tf.shape(layers.kept)[0],
        "mask": tf.zeros([0, 0, 1], tf.uint8) if layers.mask is None else layers.mask,
        **({"instance_masks": layers.instances[..., 0]} if layers.instances is not None else {}),
    }


class _Layers(NamedTuple):
    """An example's pixels and everything drawn over them, which every step moves together.

    `mask` (uint8 [h, w, 1]) and `instances` (uint8 [N, h, w, 1]) are None when the example has
    none; `kept` says which of the stored boxes `boxes` still holds.
    """

    pixels: tf.Tensor
    mask: tf.Tensor | None
    instances: tf.Tensor | None
    boxes: tf.Tensor
    kept: tf.Tensor


def _decode_instances(instance_pngs: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """The objects' masks, uint8 [N, H, W, 1], from one PNG each of the stored image's size `shape`."""
    # An empty [0, H, W, 1] for none: the reshape gives it its height and width.
    instances = tf.map_fn(
        lambda png: tf.io.decode_png(png, channels=1),
        instance_pngs,
        fn_output_signature=tf.TensorSpec([None, None, 1], tf.uint8),
    )
    return tf.reshape(instances, [tf.shape(instance_pngs)[0], shape[0], shape[1], 1])


def _random_crop(
    layers: _Layers,
    seed: tf.Tensor,
    *,
    area_range: tuple[float, float],
    aspect_ratio_range: tuple[float, float],
    min_object_covered: float,
) -> _Layers:
    """Every layer cut to one random window that covers enough of one object (the whole image when
    none fits); boxes are re-clipped to it, and those left with no area dropped."""
    begin, window_size, window = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(layers.pixels),
        bounding_boxes=tf.reshape(layers.boxes, [1, -1, 4]),
        seed=seed,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=20,
        use_image_if_no_bounding_boxes=True,
    )
    mask, instances = layers.mask, layers.instances
    if mask is not None:
        mask = tf.slice(mask, begin, [window_size[0], window_size[1], 1])
    if instances is not None:
        instances = instances[:, begin[0] : begin[0] + window_size[0], begin[1] : begin[1] + window_size[1], :]
    boxes, kept = crop_boxes(layers.boxes, tf.reshape(window, [4]))
    return _Layers(tf.slice(layers.pixels, begin, window_size), mask, instances, boxes, kept)


def _resized(layers: _Layers, out_size: tuple[int, int]) -> _Layers:
    """Every layer at `out_size`: pixels bilinear, masks nearest-neighbour (no class id is invented),
    and only the kept objects' masks. Normalised boxes do not change."""
    mask, instances = layers.mask, layers.instances
    if mask is not None:
        mask = tf.cast(tf.image.resize(mask, out_size, method="nearest"), tf.uint8)
    if instances is not None:
        instances = tf.gather(tf.cast(tf.image.resize(instances, out_size, method="nearest"), tf.uint8), layers.kept)
    pixels = tf.image.resize(layers.pixels, out_size, method="bilinear")
    return layers._replace(pixels=pixels, mask=mask, instances=instances)


def _random_flip(layers: _Layers, seed: tf.Tensor) -> _Layers:
    """Every layer flipped left to right, or none of them, half the time."""
    flip = tf.random.stateless_uniform([], seed=seed) < 0.5
    pixels, mask, instances, boxes = layers.pixels, layers.mask, layers.instances, layers.boxes
    pixels = tf.cond(flip, lambda: tf.reverse(pixels, axis=[1]), lambda: pixels)
    if mask is not None:
        mask = tf.cond(flip, lambda: tf.reverse(mask, axis=[1]), lambda: mask)
    if instances is not None:
        instances = tf.cond(flip, lambda: tf.reverse(instances, axis=[2]), lambda: instances)
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=1)
    flipped = tf.stack([ymin, 1.0 - xmax, ymax, 1.0 - xmin], axis=1)
    boxes = tf.cond(flip, lambda: flipped, lambda: boxes)
    return layers._replace(pixels=pixels, mask=mask, instances=instances, boxes=boxes)

"""Training augmentation (random resized crop, horizontal flip) from explicit seeds, and the eval path."""

from __future__ import annotations

import tensorflow as tf

from tfdata_readers.config import PILLOWS_DCT_METHOD, JpegDctMethod
from tfdata_readers.decoding.decode import decode_and_crop, decode_batch, decode_image
from tfdata_readers.sources.manifest import ImageInfo

__all__ = [
    "example_seeds",
    "sample_crop_window",
    "train_element",
    "train_batch",
    "eval_element",
    "eval_batch",
    "centre_window",
]


def example_seeds(epoch_seed: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
    """[B, 2] int64 stateless seeds, one per example: a pure function of the epoch's [2] seed and
    each example's key (its `image/key/sha256`).

    Seeding from the key, not from the example's position in the batch, makes an example's crop
    and flip independent of the order records arrive in, of the batch size, and of which input
    pipeline reads it. The key's 64-bit fingerprint is stable across processes and platforms.
    """
    ids = tf.strings.to_hash_bucket_fast(keys, (1 << 63) - 1)
    return tf.stack([tf.fill(tf.shape(ids), epoch_seed[0]), tf.bitwise.bitwise_xor(ids, epoch_seed[1])], axis=1)


def sample_crop_window(
    seed: tf.Tensor,
    image: ImageInfo,
    *,
    area_range: tuple[float, float],
    aspect_ratio_range: tuple[float, float],
    size: tf.Tensor | None = None,
) -> tf.Tensor:
    """[y, x, h, w] int32 of an Inception-style random crop, a pure function of `seed` (and of the
    example's [height, width] `size` where images keep their own sizes)."""
    if image.keeps_size:
        assert size is not None, "a dataset of varying sizes is cropped by each example's size"
        full = tf.concat([tf.cast(size, tf.int32), [image.channels]], axis=0)
    else:
        full = tf.constant([image.height, image.width, image.channels], tf.int32)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        full,
        bounding_boxes=tf.zeros([1, 0, 4], tf.float32),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def train_element(
    encoded: tf.Tensor,
    seed: tf.Tensor,
    image: ImageInfo,
    *,
    out_size: tuple[int, int],
    area_range: tuple[float, float],
    aspect_ratio_range: tuple[float, float],
    size: tf.Tensor | None = None,
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """One training image: random resized crop then random flip -> float32 [h, w, C] in [0, 255]."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    window = sample_crop_window(
        crop_seed, image, area_range=area_range, aspect_ratio_range=aspect_ratio_range, size=size
    )
    crop = decode_and_crop(encoded, window, image, size, dct_method=dct_method)
    # Flip the uint8 crop, not the float32 output: a quarter of the bytes to move.
    flipped = tf.image.stateless_random_flip_left_right(crop, seed=flip_seed)
    resized = tf.image.resize(flipped, out_size, method="bilinear")
    return tf.ensure_shape(resized, (*out_size, image.channels))


def train_batch(
    encoded: tf.Tensor,
    seeds: tf.Tensor,
    image: ImageInfo,
    *,
    out_size: tuple[int, int],
    area_range: tuple[float, float],
    aspect_ratio_range: tuple[float, float],
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """A batch of training images, float32 [B, h, w, C] in [0, 255]; seeds is [B, 2]."""
    if image.format == "RAW":
        # Pixels are already a dense batch: crop+resize every image in one crop_and_resize op.
        pixels = decode_batch(encoded, image)
        split = tf.map_fn(
            lambda s: tf.random.experimental.stateless_split(s, 2),
            seeds,
            fn_output_signature=tf.TensorSpec([2, 2], tf.int64),
        )
        windows = tf.map_fn(
            lambda s: sample_crop_window(s, image, area_range=area_range, aspect_ratio_range=aspect_ratio_range),
            split[:, 0],
            fn_output_signature=tf.TensorSpec([4], tf.int32),
        )
        w = tf.cast(windows, tf.float32)
        assert image.height is not None and image.width is not None, "images of varying sizes are decoded per element"
        h_max, w_max = float(max(image.height - 1, 1)), float(max(image.width - 1, 1))
        boxes = tf.stack(
            [w[:, 0] / h_max, w[:, 1] / w_max, (w[:, 0] + w[:, 2] - 1) / h_max, (w[:, 1] + w[:, 3] - 1) / w_max],
            axis=1,
        )
        crops = tf.image.crop_and_resize(pixels, boxes, tf.range(tf.shape(pixels)[0]), out_size, method="bilinear")
        flip = tf.map_fn(
            lambda s: tf.random.stateless_uniform([], seed=s) < 0.5,
            split[:, 1],
            fn_output_signature=tf.TensorSpec([], tf.bool),
        )
        return tf.where(flip[:, None, None, None], tf.reverse(crops, axis=[2]), crops)
    return tf.map_fn(
        lambda args: train_element(
            args[0],
            args[1],
            image,
            out_size=out_size,
            area_range=area_range,
            aspect_ratio_range=aspect_ratio_range,
            dct_method=dct_method,
        ),
        (encoded, seeds),
        fn_output_signature=tf.TensorSpec((*out_size, image.channels), tf.float32),
        parallel_iterations=16,
    )


def centre_window(size: tf.Tensor, out_size: tuple[int, int]) -> tf.Tensor:
    """[y, x, h, w] int32 of the largest centred window of an image of [height, width] `size` with
    the aspect ratio of `out_size`: the converter's crop mode, for images kept at their own size."""
    height, width = tf.unstack(tf.cast(size, tf.float32))
    scale = tf.maximum(out_size[0] / height, out_size[1] / width)
    crop_h = tf.clip_by_value(tf.round(out_size[0] / scale), 1.0, height)
    crop_w = tf.clip_by_value(tf.round(out_size[1] / scale), 1.0, width)
    window = tf.stack([tf.floor((height - crop_h) / 2), tf.floor((width - crop_w) / 2), crop_h, crop_w])
    return tf.cast(window, tf.int32)


def eval_element(
    encoded: tf.Tensor,
    image: ImageInfo,
    *,
    out_size: tuple[int, int],
    size: tf.Tensor | None = None,
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """One evaluation image, no randomness: uint8 pixels, or float32 if resized to another size.

    Staying uint8 until the batch is formed makes batching copy 4x fewer bytes. Images kept at
    their own size (`size`: the example's [height, width]) are centre-cropped to the aspect ratio
    of `out_size`, then resized: no distortion, as the converter's crop mode.
    """
    if image.keeps_size:
        assert size is not None, "a dataset of varying sizes is decoded with each example's size"
        crop = decode_and_crop(encoded, centre_window(size, out_size), image, size, dct_method=dct_method)
        return tf.ensure_shape(tf.image.resize(crop, out_size, method="bilinear"), (*out_size, image.channels))
    pixels = decode_image(encoded, image, dct_method=dct_method)
    if out_size != (image.height, image.width):
        pixels = tf.image.resize(pixels, out_size, method="bilinear")
    return pixels


def eval_batch(
    encoded: tf.Tensor,
    image: ImageInfo,
    *,
    out_size: tuple[int, int],
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """A batch of evaluation images, uint8 [B, h, w, C], or float32 if resized to another size."""
    pixels = decode_batch(encoded, image, dct_method=dct_method)
    if out_size != (image.height, image.width):
        pixels = tf.image.resize(pixels, out_size, method="bilinear")
    return pixels

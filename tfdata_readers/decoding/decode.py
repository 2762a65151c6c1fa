"""Decodes JPEG, PNG or RAW image bytes into uint8 pixels of the manifest's shape.

JPEG is decoded with Pillow's IDCT by default (`jpeg_dct_method`, ReadConfig's choice): the
converter promises the pixels Pillow gives, and a model served with Pillow must see the inputs it
trained on. TensorFlow's own default, the fast integer IDCT, differs from Pillow's by up to ~20
levels on real photos; the accurate one is libjpeg's, as Pillow's, and matches it exactly.
"""

from __future__ import annotations

import tensorflow as tf

from tfdata_readers.config import PILLOWS_DCT_METHOD, JpegDctMethod
from tfdata_readers.sources.manifest import ImageInfo

__all__ = ["decode_image", "decode_batch", "decode_and_crop", "to_float", "to_uint8", "to_output"]


def _decode_whole(encoded: tf.Tensor, image: ImageInfo, dct_method: JpegDctMethod) -> tf.Tensor:
    """JPEG or PNG bytes -> uint8 [H, W, C] of the image's own size."""
    if image.format == "JPEG":
        return tf.io.decode_jpeg(encoded, channels=image.channels, dct_method=dct_method)
    return tf.io.decode_png(encoded, channels=image.channels)


def decode_image(
    encoded: tf.Tensor,
    image: ImageInfo,
    size: tf.Tensor | None = None,
    *,
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """One image's bytes -> uint8 [H, W, C]; fails if the decoded shape differs from the manifest.

    ``size`` is the example's own [height, width] (its image/height and image/width) where the
    images keep their own sizes: a RAW image's bytes do not say it."""
    shape = (image.height, image.width, image.channels)
    if image.keeps_size:
        assert size is not None, "a dataset of varying sizes is decoded with each example's size"
        if image.format == "RAW":
            raw_shape = tf.concat([tf.cast(size, tf.int32), [image.channels]], axis=0)
            return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), raw_shape)
        return tf.ensure_shape(_decode_whole(encoded, image, dct_method), (None, None, image.channels))
    if image.format == "RAW":
        pixels = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), shape)
    else:
        pixels = _decode_whole(encoded, image, dct_method)
    return tf.ensure_shape(pixels, shape)


def decode_batch(encoded: tf.Tensor, image: ImageInfo, *, dct_method: JpegDctMethod = PILLOWS_DCT_METHOD) -> tf.Tensor:
    """A [B] batch of bytes -> uint8 [B, H, W, C]. RAW is one vectorised op; others loop with map_fn."""
    shape = (image.height, image.width, image.channels)
    if image.format == "RAW":
        # decode_raw on equal-length strings gives [B, H*W*C] in one op.
        return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), (-1, *shape))
    return tf.map_fn(
        lambda e: decode_image(e, image, dct_method=dct_method),
        encoded,
        fn_output_signature=tf.TensorSpec(shape, tf.uint8),
        parallel_iterations=16,
    )


def decode_and_crop(
    encoded: tf.Tensor,
    window: tf.Tensor,
    image: ImageInfo,
    size: tf.Tensor | None = None,
    *,
    dct_method: JpegDctMethod = PILLOWS_DCT_METHOD,
) -> tf.Tensor:
    """Decodes only `window` = [y, x, h, w] where the codec can (JPEG), else decodes then slices.

    Either way the result is the whole image's decode, sliced: a JPEG's window is widened by one
    column on each side (where the image has one) and trimmed after. A partial decode upsamples
    subsampled chroma (4:2:0, 4:2:2) as if the window's edges were the image's, which moves its
    first and last columns up to ~20 levels off the whole decode's (Pillow's); one column beyond
    each edge gives them their neighbours back."""
    if image.format == "JPEG":
        # Skips the IDCT of blocks outside the window: cheaper than decoding the whole image.
        y, x, height, width = tf.unstack(window)
        shape = tf.image.extract_jpeg_shape(encoded)
        left = tf.minimum(x, 1)
        right = tf.minimum(shape[1] - (x + width), 1)
        widened = tf.stack([y, x - left, height, width + left + right])
        pixels = tf.io.decode_and_crop_jpeg(encoded, widened, channels=image.channels, dct_method=dct_method)
        return pixels[:, left : left + width]
    pixels = decode_image(encoded, image, size, dct_method=dct_method)
    return tf.slice(pixels, [window[0], window[1], 0], [window[2], window[3], image.channels])


def to_float(pixels: tf.Tensor, scale: float | None) -> tf.Tensor:
    """float32 pixels times `scale` (None: unscaled); uint8 input is converted in a single pass."""
    if pixels.dtype == tf.uint8 and scale is not None:
        # Dequantize computes in * max_range / 255 in one pass over the pixels; cast-then-multiply
        # takes two, and on 2 cores that second pass cost ~10% of the JPEG reader's throughput.
        return tf.raw_ops.Dequantize(
            input=tf.bitcast(pixels, tf.quint8), min_range=0.0, max_range=255.0 * scale, mode="MIN_COMBINED"
        )
    pixels = tf.cast(pixels, tf.float32)
    return pixels if scale is None else pixels * scale


def to_uint8(pixels: tf.Tensor) -> tf.Tensor:
    """uint8 pixels as they are; float pixels in [0, 255] (after a resize) rounded to the nearest value."""
    if pixels.dtype == tf.uint8:
        return pixels
    return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8)


def to_output(pixels: tf.Tensor, dtype: str, scale: float | None) -> tf.Tensor:
    """The pixels in the reader's output dtype: "uint8" (unscaled) or "float32" times `scale`."""
    return to_uint8(pixels) if dtype == "uint8" else to_float(pixels, scale)

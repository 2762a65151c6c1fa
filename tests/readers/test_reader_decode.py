"""The reader's JPEG decode gives Pillow's pixels for the same stored bytes, on every path that decodes.

The converter promises "the same pixels as Pillow", and a model served with Pillow must see the
inputs it trained on. TensorFlow's default (fast) IDCT differs from Pillow's accurate one by up to
~20 levels, and a partial decode (`decode_and_crop_jpeg`) treats the window's edges as the image's
when it upsamples chroma; these tests hold every decode path to Pillow's pixels, exactly.
"""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
import reader_fixtures
import tensorflow as tf
from PIL import Image

import tfdata_readers
from tests.photos import encode, real_photo
from tfdata_readers.decoding.annotated import annotated_element
from tfdata_readers.decoding.augment import eval_element
from tfdata_readers.decoding.decode import decode_and_crop, decode_batch, decode_image
from tfdata_readers.sources.manifest import ImageInfo

# Pillow's JPEG chroma subsampling settings: 4:4:4, 4:2:2 and 4:2:0 (its default, and the converter's).
SUBSAMPLINGS = {"444": 0, "422": 1, "420": 2}
# Odd sizes on purpose: partial last blocks and MCUs, in both directions.
SIZE = (101, 75)  # (width, height)
PHOTOS = ("chelsea", "retina", "motorcycle_left")


def _pillow(encoded: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))


def _jpeg(name: str, subsampling: str, quality: int = 90) -> bytes:
    return encode(real_photo(name, SIZE), "JPEG", quality=quality, subsampling=SUBSAMPLINGS[subsampling])


def _windows(height: int, width: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    """Random [y, x, h, w] windows, the image's corners and edges among them."""
    rng = np.random.default_rng(seed)
    windows = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1), (0, 16, height, 32)]
    for _ in range(count):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        windows.append((int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w))
    return windows


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
@pytest.mark.parametrize("name", PHOTOS)
def test_whole_image_decodes_are_pillows_pixels(name: str, subsampling: str) -> None:
    encoded = _jpeg(name, subsampling)
    want = _pillow(encoded)
    height, width = want.shape[:2]
    fixed, own = ImageInfo(height, width, 3, "JPEG"), ImageInfo(None, None, 3, "JPEG")
    size = tf.constant([height, width], tf.int64)
    np.testing.assert_array_equal(decode_image(tf.constant(encoded), fixed).numpy(), want)
    np.testing.assert_array_equal(decode_image(tf.constant(encoded), own, size).numpy(), want)
    batch = decode_batch(tf.constant([encoded, encoded]), fixed).numpy()
    np.testing.assert_array_equal(batch, np.stack([want, want]))
    # Evaluation at the stored size: the pixels as they are.
    np.testing.assert_array_equal(eval_element(tf.constant(encoded), fixed, out_size=(height, width)).numpy(), want)


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
@pytest.mark.parametrize("name", PHOTOS)
def test_a_partial_decode_is_pillows_pixels_in_its_window(name: str, subsampling: str) -> None:
    """The training crop's and the kept-size evaluation's decode: only the window, Pillow's pixels in it."""
    encoded = _jpeg(name, subsampling)
    want = _pillow(encoded)
    height, width = want.shape[:2]
    size = tf.constant([height, width], tf.int64)
    for info in (ImageInfo(height, width, 3, "JPEG"), ImageInfo(None, None, 3, "JPEG")):
        for y, x, h, w in _windows(height, width, 12, seed=len(name)):
            crop = decode_and_crop(tf.constant(encoded), tf.constant([y, x, h, w]), info, size).numpy()
            np.testing.assert_array_equal(crop, want[y : y + h, x : x + w], err_msg=f"window {(y, x, h, w)}")


def test_an_annotated_examples_pixels_are_pillows() -> None:
    """Detection and segmentation decode through annotated_element: evaluation at the stored size
    leaves Pillow's pixels untouched."""
    encoded = _jpeg("coffee", "420")
    want = _pillow(encoded)
    height, width = want.shape[:2]
    view = annotated_element(
        tf.constant(encoded),
        tf.zeros([2], tf.int64),
        ImageInfo(height, width, 3, "JPEG"),
        tf.constant([[0.1, 0.1, 0.5, 0.5]]),
        out_size=(height, width),
        training=False,
    )
    np.testing.assert_array_equal(view["pixels"].numpy(), want.astype(np.float32))


@pytest.fixture(scope="module")
def photo_dataset(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Real photos at an odd size (75 x 101, 4:2:0 as the converter writes), in two splits."""
    return reader_fixtures.write_dataset(
        tmp_path_factory.mktemp("decode") / "data",
        splits={"train": (14, 2), "validation": (7, 1)},
        image_size=(SIZE[1], SIZE[0]),
    )


def _read(dataset: tf.data.Dataset) -> dict[str, np.ndarray]:
    return {
        key.decode(): pixels
        for image, _, meta in dataset
        for key, pixels in zip(meta["key"].numpy(), image.numpy(), strict=True)
    }


@pytest.mark.parametrize("placement", ["element", "batch"])
def test_the_readers_evaluation_pixels_are_pillows(photo_dataset: pathlib.Path, placement: str) -> None:
    want = reader_fixtures.pillow_pixels(photo_dataset, "train")
    got = _read(
        tfdata_readers.make_dataset(
            photo_dataset, "train", 4, dtype="uint8", with_metadata=True, decode_placement=placement
        )
    )
    assert sorted(got) == sorted(want)
    for key, pixels in got.items():
        np.testing.assert_array_equal(pixels, want[key], err_msg=key)


def test_the_readers_training_pixels_are_pillows_or_their_mirror(photo_dataset: pathlib.Path) -> None:
    """With the crop pinned to the whole image, a training image is Pillow's pixels or their mirror:
    the training path's partial decode agrees with the evaluation path's."""
    want = reader_fixtures.pillow_pixels(photo_dataset, "train")
    height, width = SIZE[1], SIZE[0]
    got = _read(
        tfdata_readers.make_dataset(
            photo_dataset,
            "train",
            4,
            training=True,
            seed=1,
            dtype="uint8",
            with_metadata=True,
            drop_remainder=False,
            crop_area_range=(1.0, 1.0),
            crop_aspect_ratio_range=(width / height, width / height),
        )
    )
    assert sorted(got) == sorted(want)
    for key, pixels in got.items():
        assert np.array_equal(pixels, want[key]) or np.array_equal(pixels, want[key][:, ::-1]), key


def test_the_fast_decode_is_a_choice_that_gives_tensorflows_fast_pixels(photo_dataset: pathlib.Path) -> None:
    stored = {}
    for record in tf.data.TFRecordDataset(
        tfdata_readers.load_manifest(photo_dataset).split("validation").shards[0].path
    ):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        stored[feature["image/key/sha256"].bytes_list.value[0].decode()] = feature["image/encoded"].bytes_list.value[0]
    got = _read(
        tfdata_readers.make_dataset(
            photo_dataset, "validation", 4, dtype="uint8", with_metadata=True, jpeg_dct_method="INTEGER_FAST"
        )
    )
    differs = 0
    for key, pixels in got.items():
        fast = tf.io.decode_jpeg(stored[key], channels=3, dct_method="INTEGER_FAST").numpy()
        np.testing.assert_array_equal(pixels, fast, err_msg=key)
        differs += not np.array_equal(pixels, _pillow(stored[key]))
    assert differs > 0  # the choice is a real one: the fast IDCT's pixels are not Pillow's


@pytest.mark.parametrize("value", ["", "INTEGER_accurate", "FLOAT", None, 1])
def test_an_unknown_dct_method_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValueError, match=r"jpeg_dct_method.*INTEGER_ACCURATE.*INTEGER_FAST") as error:
        tfdata_readers.ReadConfig(jpeg_dct_method=value)
    assert repr(value) in str(error.value)

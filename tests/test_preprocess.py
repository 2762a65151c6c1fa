"""Mode normalisation and resizing, on real photos and on every Pillow mode the job accepts."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from beam_jobs.imaging.preprocess import (
    ALPHA_BACKGROUND,
    PAD_FILL,
    normalize_mode,
    required_source_size,
    resize_image,
)
from tests.photos import real_photo


def _rgba_half_transparent() -> Image.Image:
    image = Image.new("RGBA", (8, 8), (255, 0, 0, 255))
    image.paste((0, 0, 255, 0), (0, 0, 4, 8))  # Left half fully transparent.
    return image


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(
    "make",
    [
        lambda: real_photo("chelsea", (16, 12)),
        lambda: real_photo("chelsea", (16, 12)).convert("L"),
        lambda: real_photo("chelsea", (16, 12)).convert("CMYK"),
        lambda: real_photo("chelsea", (16, 12)).convert("P"),
        lambda: real_photo("chelsea", (16, 12)).convert("1"),
        lambda: real_photo("chelsea", (16, 12)).convert("LA"),
        lambda: real_photo("chelsea", (16, 12)).convert("RGBA"),
        lambda: real_photo("chelsea", (16, 12)).convert("YCbCr"),
        lambda: Image.fromarray(np.full((12, 16), 40000, np.uint16)),  # I;16
        lambda: Image.fromarray(np.full((12, 16), 0.5, np.float32)),  # F
        lambda: Image.fromarray(np.full((12, 16), 1000, np.int32)),  # I
    ],
    ids=["RGB", "L", "CMYK", "P", "1", "LA", "RGBA", "YCbCr", "I;16", "F", "I"],
)
def test_every_mode_becomes_uint8_with_the_requested_channels(make, channels):
    result = np.asarray(normalize_mode(make(), channels=channels))
    assert result.dtype == np.uint8
    assert result.shape == ((12, 16, 3) if channels == 3 else (12, 16))


def test_sixteen_bit_is_scaled_not_clipped():
    ramp = np.linspace(0, 65535, 256).astype(np.uint16).reshape(16, 16)
    result = np.asarray(normalize_mode(Image.fromarray(ramp), channels=1))
    assert result.min() == 0 and result.max() == 255
    assert len(np.unique(result)) > 200  # A full ramp, not a wall of 255s.
    mid = np.asarray(normalize_mode(Image.fromarray(np.full((2, 2), 32768, np.uint16)), channels=1))
    assert mid[0, 0] == 128


def test_alpha_is_composited_on_the_documented_background():
    result = np.asarray(normalize_mode(_rgba_half_transparent(), channels=3))
    assert tuple(result[0, 0]) == ALPHA_BACKGROUND
    assert tuple(result[0, 7]) == (255, 0, 0)


def test_palette_with_transparency_uses_the_background():
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 255, 0] + [0, 0, 0] * 255)
    image.info["transparency"] = 0
    assert tuple(np.asarray(normalize_mode(image, channels=3))[0, 0]) == ALPHA_BACKGROUND


def test_cmyk_pure_cyan_becomes_cyan():
    image = Image.new("CMYK", (2, 2), (255, 0, 0, 0))
    assert tuple(np.asarray(normalize_mode(image, channels=3))[0, 0]) == (0, 255, 255)


def test_grayscale_is_replicated_to_three_equal_channels():
    result = np.asarray(normalize_mode(real_photo("coffee", (16, 12)).convert("L"), channels=3))
    assert np.array_equal(result[..., 0], result[..., 1]) and np.array_equal(result[..., 1], result[..., 2])


@pytest.mark.parametrize("mode", ["crop", "pad", "stretch"])
@pytest.mark.parametrize("source", [(500, 375), (375, 500), (100, 100), (40, 30)])
@pytest.mark.parametrize("target", [(224, 224), (256, 192)])
def test_every_resize_mode_gives_the_exact_target_size(mode, source, target):
    result = resize_image(real_photo("coffee", source), target, mode)
    assert result.size == target and result.mode == "RGB"


def test_pad_letterboxes_with_the_fill_and_keeps_the_whole_image():
    result = np.asarray(resize_image(Image.new("RGB", (200, 100), (255, 255, 255)), (100, 100), "pad"))
    assert tuple(result[0, 50]) == PAD_FILL and tuple(result[99, 50]) == PAD_FILL
    assert tuple(result[50, 50]) == (255, 255, 255)
    assert (result[:, :, 0] == 255).sum() == 100 * 50


def test_crop_keeps_the_centre():
    image = Image.new("RGB", (300, 100), (0, 0, 0))
    image.paste((255, 255, 255), (100, 0, 200, 100))  # White centre third.
    result = np.asarray(resize_image(image, (50, 50), "crop"))
    assert result.mean() > 250


def test_resizing_antialiases_fine_detail():
    stripes = np.zeros((400, 400), np.uint8)
    stripes[:, ::2] = 255  # One-pixel stripes alias to solid colours without antialiasing.
    result = np.asarray(resize_image(Image.fromarray(stripes).convert("RGB"), (50, 50), "stretch"))
    assert 100 < result.mean() < 155 and result.std() < 20


@pytest.mark.parametrize(
    "source, target, mode, expected",
    [
        ((4000, 3000), (224, 224), "crop", (299, 224)),
        ((4000, 3000), (224, 224), "pad", (224, 168)),
        ((4000, 3000), (224, 224), "stretch", (224, 224)),
        ((100, 100), (224, 224), "crop", (100, 100)),  # Never asks for more than the source.
    ],
)
def test_required_source_size(source, target, mode, expected):
    assert required_source_size(source, target, mode) == expected

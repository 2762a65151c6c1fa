"""Decoding: the allowlist, header-time refusals, first frames, EXIF orientation and draft mode."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from beam_jobs.errors import BadInputError
from beam_jobs.imaging.decode import decode_image, sniff_format
from tests.photos import BROKEN_FILES, encode, real_photo

MAX_PIXELS = 100_000_000


@pytest.mark.parametrize("name", sorted(BROKEN_FILES))
def test_broken_files_are_refused_with_their_reason(name):
    factory, reason = BROKEN_FILES[name]
    with pytest.raises(BadInputError) as caught:
        decode_image(factory(), max_pixels=MAX_PIXELS)
    assert caught.value.reason == reason


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP"])
def test_allowed_formats_decode_a_real_photo(fmt):
    photo = real_photo("chelsea", (120, 80))
    decoded = decode_image(encode(photo, fmt), max_pixels=MAX_PIXELS)
    assert decoded.source_format == fmt
    assert decoded.image.size == (120, 80)


@pytest.mark.parametrize("fmt", ["ICO", "PCX", "TGA"])
def test_formats_outside_the_allowlist_are_refused_even_if_pillow_reads_them(fmt):
    data = encode(real_photo("chelsea", (64, 48)), fmt)
    assert sniff_format(data) is not None or fmt == "TGA"  # Pillow itself could read these bytes.
    with pytest.raises(BadInputError) as caught:
        decode_image(data, max_pixels=MAX_PIXELS)
    assert caught.value.reason in ("format_not_allowed", "not_an_image")


def test_pixel_limit_is_checked_from_the_header():
    data = encode(real_photo("coffee"), "JPEG")  # 600x400
    with pytest.raises(BadInputError) as caught:
        decode_image(data, max_pixels=600 * 400 - 1)
    assert caught.value.reason == "too_many_pixels"
    assert decode_image(data, max_pixels=600 * 400).image.size == (600, 400)


@pytest.mark.parametrize(
    "orientation, expected_size",
    [(1, (120, 80)), (3, (120, 80)), (6, (80, 120)), (8, (80, 120))],
)
def test_exif_orientation_is_applied(orientation, expected_size):
    photo = real_photo("rocket", (120, 80))
    exif = Image.Exif()
    exif[0x0112] = orientation
    decoded = decode_image(encode(photo, "JPEG", exif=exif.tobytes()), max_pixels=MAX_PIXELS)
    assert decoded.image.size == expected_size
    assert decoded.events == []


def test_rotation_by_180_really_turns_the_pixels():
    photo = Image.new("RGB", (40, 20), (0, 0, 0))
    photo.paste((255, 255, 255), (0, 0, 20, 20))  # White on the left.
    exif = Image.Exif()
    exif[0x0112] = 3
    decoded = decode_image(encode(photo, "PNG", exif=exif.tobytes()), max_pixels=MAX_PIXELS).image
    assert decoded.getpixel((35, 10))[0] > 200 and decoded.getpixel((5, 10))[0] < 50


def test_unknown_orientation_is_ignored_and_counted():
    exif = Image.Exif()
    exif[0x0112] = 42
    decoded = decode_image(encode(real_photo("rocket", (64, 48)), "JPEG", exif=exif.tobytes()), max_pixels=MAX_PIXELS)
    assert decoded.image.size == (64, 48)
    assert decoded.events == ["exif_orientation_unknown"]


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (32, 32), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    decoded = decode_image(buffer.getvalue(), max_pixels=MAX_PIXELS).image.convert("RGB")
    red, green, blue = decoded.getpixel((16, 16))
    assert red > 200 and blue < 50


def test_jpeg_draft_decodes_large_sources_at_reduced_scale():
    data = encode(real_photo("coffee", (2400, 1600)), "JPEG", quality=90)
    for need, expected in [((300, 200), (300, 200)), ((400, 300), (600, 400)), ((1000, 700), (1200, 800))]:
        decoded = decode_image(data, max_pixels=MAX_PIXELS, draft_size_for=lambda size, need=need: need)
        # The largest DCT reduction (1/8, 1/4, 1/2) that still gives at least the needed size.
        assert decoded.image.size == expected
    full = decode_image(data, max_pixels=MAX_PIXELS)
    assert full.image.size == (2400, 1600)


def test_draft_is_not_used_below_twice_the_target():
    data = encode(real_photo("coffee", (500, 375)), "JPEG", quality=90)
    decoded = decode_image(data, max_pixels=MAX_PIXELS, draft_size_for=lambda size: (299, 224))
    assert decoded.image.size == (500, 375)

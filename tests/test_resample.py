"""The fast path and --resample: libjpeg-turbo gives Pillow's pixels, every method antialiases and
beats the usual script's quality, bicubic is the old pipeline byte for byte, and the bytes do not
depend on the CPU's SIMD instructions."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError
from beam_jobs.imaging.decode import decode_image, decode_rgb_pixels
from beam_jobs.imaging.example_proto import Example
from beam_jobs.imaging.preprocess import normalize_mode, required_source_size, resize_image, resize_pixels
from beam_jobs.imaging.resample import (
    RESAMPLE_METHODS,
    SINC_STEP,
    opencv,
    resample_array,
    resample_box,
    sinc_prefilter_taps,
)
from beam_jobs.records import InputFile
from beam_jobs.writing.convert_shards import convert_image
from beam_jobs.writing.finalize import SCHEMA_VERSION, run_fingerprint
from tests.photos import encode, real_photo

MAX_PIXELS = 100_000_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _jpeg(image: Image.Image, orientation: int = 1, **params) -> bytes:
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, exif=exif, **params)
    return buffer.getvalue()


def _pillow_pixels(data: bytes, target: tuple[int, int]) -> np.ndarray:
    need = partial(required_source_size, target=target, resize_mode="crop")
    return np.asarray(normalize_mode(decode_image(data, max_pixels=MAX_PIXELS, draft_size_for=need).image, channels=3))


def _fast_pixels(data: bytes, target: tuple[int, int]) -> np.ndarray:
    need = partial(required_source_size, target=target, resize_mode="crop")
    return decode_rgb_pixels(
        data, max_pixels=MAX_PIXELS, draft_size_for=need, normalize=partial(normalize_mode, channels=3)
    ).pixels


_KINDS = {
    "4:4:4": lambda image: _jpeg(image, subsampling=0),
    "4:2:0": lambda image: _jpeg(image, subsampling=2),
    "progressive": lambda image: _jpeg(image, progressive=True),
    "grayscale": lambda image: _jpeg(image.convert("L")),
    "cmyk (Pillow decodes it)": lambda image: _jpeg(image.convert("CMYK")),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_fast_decode_gives_pillows_pixels_at_every_draft_scale(kind, orientation):
    # A photo not square, so that every transposition is told apart; targets that make Pillow's
    # draft pick 1/1, 1/2, 1/4 and 1/8.
    photo = real_photo("astronaut", (960, 640))
    data = (
        _KINDS[kind](photo)
        if orientation == 1
        else _jpeg(photo.convert("L") if kind == "grayscale" else photo, orientation)
    )
    for target in ((100, 80), (224, 224), (400, 300), (900, 900)):
        fast, pillow = _fast_pixels(data, target), _pillow_pixels(data, target)
        assert fast.shape == pillow.shape and fast.dtype == np.uint8, (target, fast.shape, pillow.shape)
        assert np.array_equal(fast, pillow), (kind, orientation, target)


def test_a_truncated_jpeg_gets_pillows_verdict():
    data = _jpeg(real_photo("chelsea", (300, 200)))[:-600]
    with pytest.raises(BadInputError) as pillow:
        decode_image(data, max_pixels=MAX_PIXELS)
    with pytest.raises(BadInputError) as fast:
        _fast_pixels(data, (224, 224))
    assert fast.value.reason == pillow.value.reason == "truncated"


def test_a_jpeg_libjpeg_warns_about_but_pillow_reads_is_kept_with_pillows_pixels():
    # Stray bytes before a marker: libjpeg-turbo warns ("extraneous bytes"), Pillow decodes it.
    data = _jpeg(real_photo("chelsea", (300, 200)))
    sos = data.index(b"\xff\xda")
    damaged = data[:sos] + b"\x00\x01\x02" + data[sos:]
    assert np.array_equal(_fast_pixels(damaged, (224, 224)), _pillow_pixels(damaged, (224, 224)))


@pytest.mark.parametrize("method", RESAMPLE_METHODS)
def test_every_method_antialiases_one_pixel_stripes(method):
    stripes = np.zeros((200, 200), dtype=np.uint8)
    stripes[:, ::2] = 255
    image = Image.fromarray(stripes).convert("RGB")
    result = np.asarray(resize_image(image, (50, 50), "stretch", method)).astype(float)
    # A quarter of the size: stripes finer than the output's pixels must average to grey, not alias.
    assert abs(result.mean() - 127.5) < 8 and result.std() < 12, (method, result.mean(), result.std())


@pytest.mark.parametrize("mode", ["crop", "pad", "stretch"])
@pytest.mark.parametrize("method", ["dct_sinc", "dct_linear", "dct_bicubic", "antialias", "area"])
def test_arrays_and_images_resize_alike(mode, method):
    photo = real_photo("coffee", (333, 222))
    from_image = np.asarray(resize_image(photo, (100, 120), mode, method))
    from_array = resize_pixels(np.asarray(photo), (100, 120), mode, method)
    assert from_array.shape == (120, 100, 3) and np.array_equal(from_image, from_array)


def _psnr(a, b) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / mse)


def _decoded_output(config: ImageConfig, data: bytes) -> Image.Image:
    record = convert_image(data, InputFile("p.jpg", "/p.jpg", label="a", label_id=0), config)[0]
    encoded = Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0]
    return Image.open(io.BytesIO(encoded)).convert("RGB")


def _reference_box(data: bytes, method: str, size: int = 224) -> tuple[float, float, float, float]:
    from benchmarks._job_box import job_source_box  # pylint: disable=import-outside-toplevel

    return job_source_box(data, method, size=size)


@pytest.mark.parametrize("method", ["dct_sinc", "dct_linear", "dct_bicubic", "bicubic", "antialias"])
def test_the_default_and_the_fast_methods_are_closer_to_lanczos_than_the_usual_bilinear_script(method):
    """The quality bar: the PSNR against a full decode resized with Lanczos (the same crop) is at
    least that of `draft` + ImageOps.fit(BILINEAR), at the same JPEG quality, on real photos."""
    default, script = [], []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "china", "flower"):
        photo = real_photo(name, (500, 375))
        data = _jpeg(photo)
        full = Image.open(io.BytesIO(data)).convert("RGB")
        ours = _decoded_output(ImageConfig(resample=method), data)
        box = _reference_box(data, method)
        default.append(_psnr(ours, full.resize((224, 224), Image.Resampling.LANCZOS, box=box)))
        drafted = Image.open(io.BytesIO(data))
        drafted.draft("RGB", (224, 224))
        fitted = ImageOps.fit(drafted.convert("RGB"), (224, 224), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        fitted.save(buffer, "JPEG", quality=ImageConfig().jpeg_quality)
        theirs = Image.open(buffer).convert("RGB")
        script.append(_psnr(theirs, ImageOps.fit(full, (224, 224), Image.Resampling.LANCZOS)))
    assert np.mean(default) >= np.mean(script), (default, script)


def _test_patterns(side: int) -> dict[str, np.ndarray]:
    """1 px stripes along each axis, a checkerboard and a zone plate (its rings finer than a
    side / 224 shrink can hold are masked in: only they must come out flat), as RGB."""
    y, x = np.mgrid[0:side, 0:side]
    stripes = ((x % 2) * 255).astype(np.uint8)
    zone = (127.5 * (1 + np.cos(np.pi * ((x - side / 2) ** 2 + (y - side / 2) ** 2) / side))).round()
    return {
        "stripes along x": stripes,
        "stripes along y": stripes.T.copy(),
        "checkerboard": (((x + y) % 2) * 255).astype(np.uint8),
        "zone plate": zone.astype(np.uint8),
    }


@pytest.mark.parametrize("factor", [1.5, 1.7, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0])
@pytest.mark.parametrize("method", sorted({ImageConfig().resample_method, "dct_linear"}))
def test_the_default_and_dct_linear_leave_detail_finer_than_the_output_flat_from_one_and_a_half_times(method, factor):
    """The aliasing bar (as PNGs, so no DCT reduction helps): every pattern shrunk to 224 px by
    ``factor`` keeps a standard deviation, where it is finer than the output can show, under 5
    of 255 or at most Pillow's bicubic's own (the zone plate's band just above the output's
    Nyquist frequency, which every practical filter's transition lets through in part, and 1 px
    stripes at 1.5x: 11.8). "dct_linear" keeps every pattern under 5 from 1.5x. The figures per
    factor: docs/benchmarks.md (benchmarks/resampling.py)."""
    side = round(224 * factor)
    oy, ox = np.mgrid[0:224, 0:224]
    radius = np.hypot((ox + 0.5) * factor - side / 2, (oy + 0.5) * factor - side / 2)
    fine_ring = (radius / side > 1.2 * 0.5 / factor) & (radius < side / 2)
    for name, pattern in _test_patterns(side).items():
        pixels = np.repeat(pattern[..., None], 3, axis=2)
        spreads = {}
        for each in (method, "bicubic"):
            out = resize_pixels(pixels, (224, 224), "stretch", each) if each != "bicubic" else None
            if out is None:
                out = np.asarray(Image.fromarray(pixels).resize((224, 224), Image.Resampling.BICUBIC))
            out = out[..., 0].astype(float)
            spreads[each] = float((out[fine_ring] if name == "zone plate" else out).std())
        bar = 5.0 if method == "dct_linear" else max(5.0, spreads["bicubic"] + 0.5)
        assert spreads[method] < bar, (method, name, factor, spreads)


@pytest.mark.parametrize(
    ("scale", "delay"), [(1.06, 0), (1.254, 0), (1.37, 0), (1.499, 0), (1.254, 0.875), (0.8, 0.5), (1.45, 0.25)]
)
def test_the_dct_sinc_prefilter_is_exact_in_float32(scale, delay):
    """The prefilter's taps (a box edge between pixels delays them) are multiples of 1/128
    summing to exactly 1, so OpenCV's float filter gives exactly what exact arithmetic rounded
    half to even gives: no sum's order or fused multiply-add of another CPU can change a byte
    (resample.SINC_STEP)."""
    taps = sinc_prefilter_taps(scale, delay)
    assert taps is not None and (delay or taps == taps[::-1])
    steps = [tap * SINC_STEP for tap in taps]
    assert all(step == int(step) for step in steps) and sum(steps) == SINC_STEP
    assert sum(abs(tap) for tap in taps) <= 1.57
    pixels = np.ascontiguousarray(np.asarray(real_photo("astronaut", (301, 257))))
    kernel = np.array(taps)
    anchor = (len(taps) - 1) // 2
    filtered = opencv().sepFilter2D(
        pixels, -1, kernel, kernel, anchor=(anchor, anchor), borderType=opencv().BORDER_REFLECT
    )
    before, after = anchor, len(taps) - 1 - anchor
    padded = np.pad(pixels.astype(np.float64), ((before, after), (before, after), (0, 0)), mode="symmetric")
    rows = sum(tap * padded[:, i : i + pixels.shape[1]] for i, tap in enumerate(taps))
    exact = sum(tap * rows[i : i + pixels.shape[0]] for i, tap in enumerate(taps))
    assert np.array_equal(filtered, np.clip(np.rint(exact), 0, 255).astype(np.uint8))


def test_dct_sinc_resamples_a_box_with_fractional_edges_as_it_is():
    """A box half a pixel off the whole pixels (the centre box of 271x180 in a square) comes out
    where Pillow's Lanczos puts that very box, not half a pixel beside it."""
    pixels = np.ascontiguousarray(np.asarray(real_photo("astronaut", (300, 300))))
    box = (10.5, 20.0, 210.5, 220.0)
    ours = resample_box(pixels, box, (200, 200))
    assert _psnr(ours, Image.fromarray(pixels).resize((200, 200), Image.Resampling.LANCZOS, box=box)) > 55
    beside = Image.fromarray(pixels).resize((200, 200), Image.Resampling.LANCZOS, box=(10, 20, 210, 220))
    assert _psnr(ours, beside) < 30
    shrunk = resample_box(pixels, (10.25, 20.75, 260.25, 270.75), (200, 200))
    exact = Image.fromarray(pixels).resize((200, 200), Image.Resampling.LANCZOS, box=(10.25, 20.75, 260.25, 270.75))
    assert _psnr(shrunk, exact) > 42


@pytest.mark.parametrize("size", [(200, 200), (90, 90)])  # the sinc path, and Pillow's Lanczos from 1.5x
def test_dct_sinc_takes_a_box_a_rounded_part_pixel_leaves_past_the_array(size):
    """A decode whose part-pixel row was rounded away shows 281.25 rows in 281: the exact box then
    ends a quarter pixel past the array, which neither path may refuse."""
    pixels = np.ascontiguousarray(np.asarray(real_photo("retina", (375, 281))))
    out = resample_box(pixels, (46.875, 0.0, 328.125, 281.25), size)
    assert out.shape == (size[1], size[0], 3)


@pytest.mark.parametrize("mode", ["crop", "stretch"])
def test_the_default_keeps_the_geometry_of_jpegs_of_every_size(mode):
    """The DCT-scaled decode of a JPEG whose size is not a multiple of 8 ends in a part-pixel, and
    a centre box of a source and output of different parity is not whole pixels: dropped or
    rounded, either shifted or shrank the output by up to a pixel (26 to 31 dB against a Lanczos
    resize of the source, on sizes a user meets). Measured against the exact centre box."""
    photo = real_photo("coffee")
    worst = {}
    for width in (271, 333, 425, 446, 509, 530):
        height = width * 2 // 3
        data = _jpeg(photo.resize((width, height), Image.Resampling.LANCZOS))
        size = (224, 224 if mode == "crop" else 149)
        config = ImageConfig(resample="dct_sinc", width=size[0], height=size[1], resize_mode=mode, encoding="png")
        record = convert_image(data, InputFile("p.jpg", "/p.jpg", label="a", label_id=0), config)[0]
        stored = Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0]
        full = Image.open(io.BytesIO(data)).convert("RGB")
        box = (
            ImageOps.fit(full, size, Image.Resampling.LANCZOS)
            if mode == "crop"
            else full.resize(size, Image.Resampling.LANCZOS)
        )
        worst[width] = _psnr(Image.open(io.BytesIO(stored)).convert("RGB"), box)
    assert min(worst.values()) > 38, worst


@pytest.mark.parametrize("size", [(2, 3), (6, 6), (3, 300), (300, 4)])
def test_the_default_decodes_a_jpeg_with_a_side_under_8_pixels_whole(size):
    """A scale M/8 rounds such a side up as far as 8/8 does, and the part-pixel then cut would
    lose a row or column of a 2x3 image; the default decodes it whole."""
    pixels = (np.random.default_rng(0).random((size[1], size[0], 3)) * 255).astype(np.uint8)
    data = _jpeg(Image.fromarray(pixels))
    need = partial(required_source_size, target=(224, 224), resize_mode="stretch", margin=1.1)
    decoded = decode_rgb_pixels(
        data,
        max_pixels=10**8,
        normalize=partial(normalize_mode, channels=3),
        draft_size_for=need,
        any_dct_scale="nearest",
    )
    assert decoded.pixels.shape[1::-1] == size
    assert np.array_equal(decoded.pixels, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_dct_sinc_hands_a_shrink_of_one_and_a_half_or_more_to_pillows_lanczos():
    pixels = np.ascontiguousarray(np.asarray(real_photo("chelsea", (300, 200))))
    lanczos = np.asarray(Image.fromarray(pixels).resize((200, 133), Image.Resampling.LANCZOS))
    assert np.array_equal(resample_array(pixels, (200, 133), "dct_sinc"), lanczos)  # 1.5x
    assert sinc_prefilter_taps(1.05) is None  # nothing the output can hold is above the cut-off
    near = np.asarray(Image.fromarray(pixels).resize((240, 160), Image.Resampling.LANCZOS))
    assert not np.array_equal(resample_array(pixels, (240, 160), "dct_sinc"), near)  # 1.25x: its own


@pytest.mark.parametrize("size", [128, 224])
def test_the_default_is_closer_to_lanczos_than_the_default_before_it_on_real_photos(size):
    """The reason dct_sinc replaced dct_bicubic as the default: on real photos at their own sizes,
    its output is closer to a Lanczos resize of the full decode over the exact centre box (what
    ImageOps.fit gives; dct_bicubic cuts a whole-pixel box off a decode whose part-pixel it
    dropped), at a third of the resize time."""
    scores: dict[str, list[float]] = {"dct_sinc": [], "dct_bicubic": []}
    for name in ("astronaut", "chelsea", "coffee", "rocket", "china", "flower", "motorcycle_left"):
        data = _jpeg(real_photo(name))
        full = Image.open(io.BytesIO(data)).convert("RGB")
        reference = ImageOps.fit(full, (size, size), Image.Resampling.LANCZOS)
        for method, found in scores.items():
            ours = _decoded_output(ImageConfig(resample=method, width=size, height=size), data)
            found.append(_psnr(ours, reference))
    assert np.mean(scores["dct_sinc"]) > np.mean(scores["dct_bicubic"]) + 1, scores


def test_the_dct_reduced_methods_decode_a_jpeg_at_its_smallest_eighth_above_the_need():
    """500x375 to a 224 px crop needs 299x224 (329x247 with the margin): libjpeg-turbo's 6/8
    scale (375x281.25) is the smallest that holds it, where Pillow's draft has only 1/1."""
    data = _jpeg(real_photo("coffee", (500, 375)))
    need = partial(required_source_size, target=(224, 224), resize_mode="crop", margin=1.1)
    pixels = decode_rgb_pixels(
        data,
        max_pixels=MAX_PIXELS,
        draft_size_for=need,
        normalize=partial(normalize_mode, channels=3),
        any_dct_scale=True,
    ).pixels
    assert pixels.shape == (281, 375, 3)  # 281.25 rows: the part-row is dropped
    assert _fast_pixels(data, (224, 224)).shape == (375, 500, 3)


def test_bicubic_is_the_pipeline_of_every_release_before_resample_byte_for_byte():
    """Pillow's decode with draft, its EXIF transpose, a BICUBIC resize of the fractional centre
    box and Pillow's JPEG encoder: what convert_image did before --resample existed."""
    photo = real_photo("astronaut", (900, 700))
    data = _jpeg(photo, orientation=6)
    image = Image.open(io.BytesIO(data))
    upright = (image.size[1], image.size[0])
    image.draft("RGB", required_source_size(upright, (224, 224), "crop")[::-1])
    image = ImageOps.exif_transpose(image).convert("RGB")
    scale = max(224 / image.size[0], 224 / image.size[1])
    box_w, box_h = 224 / scale, 224 / scale
    left, top = (image.size[0] - box_w) / 2, (image.size[1] - box_h) / 2
    old = image.resize((224, 224), Image.Resampling.BICUBIC, box=(left, top, left + box_w, top + box_h))
    buffer = io.BytesIO()
    old.save(buffer, "JPEG", quality=95)
    record = convert_image(data, InputFile("p.jpg", "/p.jpg", label="a", label_id=0), ImageConfig(resample="bicubic"))[
        0
    ]
    assert Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0] == buffer.getvalue()


def test_bicubic_keeps_the_fingerprint_of_datasets_made_before_resample():
    settings = {"split_rule": "stratified"}
    config = ImageConfig(resample="bicubic")
    old_config = {key: value for key, value in config.to_json().items() if key != "resample"}
    text = json.dumps({"config": old_config, "settings": settings, "schema": SCHEMA_VERSION}, sort_keys=True)
    assert run_fingerprint(config, settings) == hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    assert run_fingerprint(ImageConfig(resample="antialias"), settings) != run_fingerprint(config, settings)
    # The default of new datasets is another method, so its datasets are told apart from bicubic's.
    assert ImageConfig().resample_method == "dct_sinc"
    assert run_fingerprint(ImageConfig(), settings) != run_fingerprint(config, settings)
    assert run_fingerprint(ImageConfig(), settings) != run_fingerprint(ImageConfig(resample="dct_bicubic"), settings)


_CONVERT_SOME = r"""
import hashlib, io, sys
from PIL import Image
from beam_jobs.config import ImageConfig
from beam_jobs.writing.convert_shards import convert_image
from beam_jobs.records import InputFile
from tests.photos import encode, real_photo
digest = hashlib.sha256()
for name in ("astronaut", "chelsea", "coffee"):
    for size in ((500, 375), (1000, 1400)):
        buffer = io.BytesIO()
        real_photo(name, size).save(buffer, "JPEG", quality=90)
        for mode in ("crop", "pad"):
            for method in ("dct_sinc", "dct_linear", "dct_bicubic", "antialias", "area"):
                config = ImageConfig(resize_mode=mode, resample=method)
                digest.update(convert_image(buffer.getvalue(), InputFile("p", "/p", label="a", label_id=0), config)[0])
import cv2
print(digest.hexdigest(), cv2.getCPUFeaturesLine())
"""


def test_the_bytes_do_not_depend_on_the_cpus_simd_instructions():
    """OpenCV's and libjpeg-turbo's SIMD code paths turned off (their own switches) give the
    same records: a Dataflow worker with another CPU writes the same shards. (libjpeg-turbo's
    JSIMD_FORCENONE was seen to work: its decode took 1.8x as long under it.)"""

    def run(extra_env: dict[str, str]) -> tuple[str, str]:
        env = {**os.environ, "PYTHONPATH": REPO, **extra_env}
        proc = subprocess.run(
            [sys.executable, "-c", _CONVERT_SOME], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        digest, features = proc.stdout.strip().split(" ", 1)
        return digest, features

    plain, features = run({})
    without_simd, disabled = run(
        {"OPENCV_CPU_DISABLE": "SSE4.1,SSE4.2,AVX,FP16,AVX2,AVX512-SKX", "JSIMD_FORCENONE": "1"}
    )
    # OpenCV marks each dispatched feature it was told not to use with "?".
    assert "*AVX2" not in features or "*AVX2?" in disabled, (features, disabled)
    assert len(plain) == 64 and plain == without_simd


def _spec(tmp_path, **keywords):
    from beam_jobs.api import spec_from_keywords  # pylint: disable=import-outside-toplevel

    (tmp_path / "photos" / "a").mkdir(parents=True, exist_ok=True)
    arguments = {"input": str(tmp_path / "photos"), "output_dir": str(tmp_path / "out"), **keywords}
    return spec_from_keywords(arguments)[0]


def _interrupted_run(out, preprocessing: dict) -> None:
    """A run folder killed while converting its second shard: the first one's sidecar, and the
    second one's progress note (which names no settings)."""
    from beam_jobs.writing.run_folders import new_run_name  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.shard_progress import progress_note_name  # pylint: disable=import-outside-toplevel

    name = new_run_name()
    run = out / "shards" / name
    run.mkdir(parents=True)
    sidecar = {"run_fingerprint": "0" * 32, "preprocessing": preprocessing}
    (run / ".train-00000-of-00002.tfrecord.json").write_text(json.dumps(sidecar))
    (run / progress_note_name(name, "train-00001-of-00002.tfrecord")).write_text(json.dumps({"images": 3}))


@pytest.mark.parametrize(
    ("keywords", "recorded", "method"),
    [
        ({}, None, "dct_sinc"),  # a new dataset: the default
        ({"resume": True}, None, "dct_sinc"),  # nothing to continue
        ({"resume": True}, {"resample": "bicubic"}, "bicubic"),  # an interrupted run of the first default
        ({"resume": True}, {"resample": "dct_bicubic"}, "dct_bicubic"),  # one of the default before
        ({"resume": True}, {"resample": "dct_sinc"}, "dct_sinc"),  # one of the default
        ({"resume": True}, {}, "bicubic"),  # one of a release before --resample
        ({"resume": True}, {"resample": "antialias"}, "antialias"),
        ({"resume": True, "resample": "lanczos"}, {"resample": "bicubic"}, "lanczos"),  # chosen: kept
        ({}, {"resample": "dct_bicubic"}, "dct_sinc"),  # not continued: the default
    ],
)
def test_without_a_chosen_resampling_a_resumed_run_keeps_its_own(tmp_path, keywords, recorded, method):
    from beam_jobs.preflight import with_dataset_defaults  # pylint: disable=import-outside-toplevel

    if recorded is not None:
        _interrupted_run(tmp_path / "out", recorded)
    else:
        (tmp_path / "out").mkdir()
    spec = with_dataset_defaults(_spec(tmp_path, **keywords))
    assert spec.image.resample == method and spec.image.to_json()["resample"] == method


def test_a_run_killed_before_its_first_shard_resumes_with_the_resampling_it_was_making(tmp_path):
    """An --overwrite of a dataset made with the default before, killed outright (SIGKILL: nothing
    of the run's own runs after it) before any shard was staged, was resumed with that dataset's
    resampling, since the run had no sidecar to name its own; killed a moment later, with its own.
    A run records its settings as it starts, so the moment no longer matters; the commit removes
    the record, and the killed run's folder goes with the commit's garbage collection."""
    from beam_jobs.preflight import start_run, with_dataset_defaults  # pylint: disable=import-outside-toplevel
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    make_photo_tree(tmp_path / "photos", num_images=4, seed=3, classes=["coffee", "china"])
    out = tmp_path / "out"
    job = [sys.executable, "-m", "beam_jobs", "--input", str(tmp_path / "photos"), "--output_dir", str(out)]
    subprocess.run([*job, "--image_size", "24", "--resample", "dct_bicubic"], cwd=REPO, check=True, capture_output=True)
    [made] = (out / "shards").iterdir()
    killed = start_run(with_dataset_defaults(_spec(tmp_path, image_size=24, overwrite=True)))  # then SIGKILL
    assert json.loads((out / "shards" / killed.run_id / ".run.json").read_text())["preprocessing"]["resample"] == (
        "dct_sinc"
    )
    assert with_dataset_defaults(_spec(tmp_path, image_size=24, overwrite=True, resume=True)).image.resample == (
        "dct_sinc"
    )
    resumed = subprocess.run(
        [*job, "--image_size", "24", "--overwrite", "--resume"], cwd=REPO, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["version"] == 2 and info["preprocessing"]["resample"] == "dct_sinc"
    runs = {run.name: sorted(f.name for f in run.iterdir()) for run in (out / "shards").iterdir()}
    assert killed.run_id not in runs and made.name in runs and len(runs) == 2, runs
    assert not any(".run.json" in names for names in runs.values()), runs


@pytest.mark.parametrize(
    ("recorded", "method"),
    [({"resample": "antialias"}, "antialias"), ({"resample": "dct_bicubic"}, "dct_bicubic"), ({}, "bicubic")],
)
def test_without_a_chosen_resampling_an_append_keeps_the_versions_own(tmp_path, recorded, method):
    from beam_jobs.preflight import with_dataset_defaults  # pylint: disable=import-outside-toplevel

    out = tmp_path / "out"
    out.mkdir()
    manifest = {"version": 1, "fingerprint": "0" * 32, "preprocessing": {"image_size": "24x24", **recorded}}
    (out / "dataset_info.json").write_text(json.dumps(manifest))
    assert with_dataset_defaults(_spec(tmp_path, append=True)).image.resample == method


def _raw_pixels(record: bytes, channels: int) -> np.ndarray:
    feature = Example.FromString(record).features.feature
    height, width = (feature[f"image/{key}"].int64_list.value[0] for key in ("height", "width"))
    encoded = feature["image/encoded"].bytes_list.value[0]
    return np.frombuffer(encoded, dtype=np.uint8).reshape(height, width, channels)


@pytest.mark.parametrize("method", ["dct_sinc", "dct_bicubic", "antialias"])
@pytest.mark.parametrize("size", [(333, 250), (500, 375), (61, 97)])
def test_grey_comes_from_the_luma_plane_through_the_colour_paths_geometry(method, size):
    """--channels 1 took Pillow's decode and its "L" conversion whatever the resampling: no DCT
    reduction to the method's scale (twice the time of the colour path per image), and Pillow's
    draft scale in place of the method's exact one. A grey JPEG now gives, pixel for pixel, the
    channel the colour path repeats; a colour JPEG gives its luma plane, within a level or two of
    the luma of the colour path's pixels (which went through the chroma and back)."""
    photo = real_photo("chelsea", size)
    grey_jpeg = encode(photo.convert("L"), "JPEG", quality=92)
    colour_jpeg = encode(photo, "JPEG", quality=92)
    input_file = InputFile("a/x.jpg", "x", label="a", label_id=0)

    def pixels(data: bytes, channels: int) -> np.ndarray:
        config = ImageConfig(width=48, height=40, channels=channels, resample=method, encoding="raw")
        assert config.decodes_luma == (channels == 1)
        return _raw_pixels(convert_image(data, input_file, config)[0], channels)

    grey = pixels(grey_jpeg, 1)
    assert np.array_equal(grey[:, :, 0], pixels(grey_jpeg, 3)[:, :, 0])
    colour = pixels(colour_jpeg, 3).astype(np.float64)
    luma = colour @ np.array([0.299, 0.587, 0.114])
    difference = np.abs(pixels(colour_jpeg, 1)[:, :, 0] - luma)
    assert difference.mean() < 1.0 and difference.max() <= 6, (difference.mean(), difference.max())


def test_grey_decode_is_recorded_only_where_it_decides_the_pixels():
    assert ImageConfig(channels=1).to_json()["grey_decode"] == "luma"
    assert ImageConfig(channels=1, resample="antialias").to_json()["grey_decode"] == "luma"
    for config in (
        ImageConfig(),  # colour
        ImageConfig(channels=1, resample="bicubic"),  # Pillow's resampling: Pillow's grey
        ImageConfig(channels=1, grey_decode="pillow"),  # as every grey dataset made before "luma"
    ):
        assert "grey_decode" not in config.to_json(), config
    with pytest.raises(ValueError, match="grey_decode must be one of"):
        ImageConfig(grey_decode="y")


def test_a_grey_dataset_made_with_pillows_grey_appends_as_it_was(tmp_path):
    """A --channels 1 dataset made before grey came from the luma plane records no grey_decode:
    an append with the same flags extends it with Pillow's grey, byte for byte as one run
    making all of it, and a new dataset takes the luma plane."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    from beam_jobs.api import convert, spec_from_keywords  # pylint: disable=import-outside-toplevel
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel
    from tests.lifecycle.test_append_rules import _encoded_by_filename  # pylint: disable=import-outside-toplevel

    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=6, seed=5, classes=["coffee", "china"])

    def made_before(output_dir) -> None:
        spec = spec_from_keywords(
            {"input": str(photos), "output_dir": str(output_dir), "image_size": 24, "channels": 1}
        )[0]
        convert(spec=spec.replace(image=dataclasses.replace(spec.image, grey_decode="pillow")))

    out = tmp_path / "out"
    made_before(out)
    assert "grey_decode" not in json.loads((out / "dataset_info.json").read_text())["preprocessing"]
    for photo in make_photo_tree(tmp_path / "more", num_images=9, seed=5, classes=["coffee", "china"]):
        if not (photos / photo.parent.name / photo.name).exists():  # the 3 new ones
            photo.rename(photos / photo.parent.name / photo.name)
    job = [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--image_size", "24", "--channels", "1"]
    appended = subprocess.run([*job, "--output_dir", str(out), "--append"], cwd=REPO, capture_output=True, text=True)
    assert appended.returncode == 0, appended.stderr[-3000:]
    assert json.loads((out / "dataset_info.json").read_text())["version"] == 2
    whole = tmp_path / "whole"
    made_before(whole)
    assert _encoded_by_filename(out) == _encoded_by_filename(whole)  # all 9, the 3 appended included
    new = tmp_path / "new"
    subprocess.run([*job, "--output_dir", str(new)], cwd=REPO, check=True, capture_output=True)
    assert json.loads((new / "dataset_info.json").read_text())["preprocessing"]["grey_decode"] == "luma"
    assert _encoded_by_filename(new).keys() == _encoded_by_filename(whole).keys()
    assert _encoded_by_filename(new) != _encoded_by_filename(whole)

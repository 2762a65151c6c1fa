"""Hostile images through the real CLI: each is a dead letter with a reason, the job goes on,
and the output holds no trace of it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_jobs.errors import BadInputError
from beam_jobs.imaging.decode import decode_image
from beam_jobs.imaging.preprocess import normalize_mode
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO, run_cli
from tests.dataset_files import current_files, dead_letters_path
from tests.photos import HOSTILE_FILES, ODD_VALID_FILES, _png_header_bomb

pytestmark = pytest.mark.slow

SPEC = {"image/filename": tf.io.FixedLenFeature([], tf.string), "image/encoded": tf.io.FixedLenFeature([], tf.string)}


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    good = make_photo_tree(root, num_images=18, seed=2)
    (root / "odd").mkdir()
    for name, factory in ODD_VALID_FILES.items():
        (root / "odd" / name).write_bytes(factory())
    for name, (factory, _) in HOSTILE_FILES.items():
        (root / "chelsea" / f"bad_{name}").write_bytes(factory())
    outputs = []
    for attempt in range(2):
        out = tmp_path_factory.mktemp(f"hostile-out-{attempt}")
        result = run_cli(
            "--input",
            root,
            "--output_dir",
            out,
            "--image_size",
            "32",
            "--encoding",
            "png",
            "--num_shards",
            "2",
            "--max_bad_fraction",
            "1.0",
        )
        outputs.append((out, result))
    return root, good, outputs


def _records(out) -> dict[str, bytes]:
    info = json.loads((out / "dataset_info.json").read_text())
    files = [str(out / s["file"]) for split in info["splits"].values() for s in split["shards"]]
    records = {}
    for batch in tf.data.TFRecordDataset(files).batch(100).map(lambda b: tf.io.parse_example(b, SPEC)):
        for name, encoded in zip(batch["image/filename"].numpy(), batch["image/encoded"].numpy(), strict=True):
            records[name.decode()] = encoded
    return records


def test_each_hostile_file_is_a_dead_letter_with_its_reason(hostile_run):
    root, _, [(out, _), _] = hostile_run
    dead = {json.loads(line)["uri"]: json.loads(line) for line in dead_letters_path(out).read_text().splitlines()}
    assert set(dead) == {str(root / "chelsea" / f"bad_{name}") for name in HOSTILE_FILES}
    for name, (_, reason) in HOSTILE_FILES.items():
        got = dead[str(root / "chelsea" / f"bad_{name}")]["reason"]
        allowed = {"truncated", "decode_error"} if reason == "truncated_or_undecodable" else {reason}
        if name.startswith("truncated_head"):
            allowed.add("not_an_image")  # 40 bytes are too few for the header to say what it is.
        assert got in allowed, (name, got)


def test_the_output_holds_the_good_and_odd_files_and_no_trace_of_the_bad(hostile_run):
    root, good, [(out, _), _] = hostile_run
    records = _records(out)
    assert set(records) == {str(p.relative_to(root)) for p in good} | {f"odd/{n}" for n in ODD_VALID_FILES}
    assert not any("/bad_" in name for name in records)
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["num_dead_letters"] == len(HOSTILE_FILES)
    assert sum(s["num_examples"] for s in info["splits"].values()) == len(records)
    for encoded in records.values():
        assert tf.io.decode_png(encoded).shape == (32, 32, 3)


def test_animated_and_multipage_files_give_the_same_first_frame_on_every_run(hostile_run):
    root, _, [(out1, _), (out2, _)] = hostile_run
    first, second = _records(out1), _records(out2)
    for name in ("odd/animated.gif", "odd/multipage.tif"):
        assert first[name] == second[name]
    pixels = tf.io.decode_png(first["odd/animated.gif"]).numpy().astype(int)
    rocket = np.asarray(
        Image.open(__import__("io").BytesIO(ODD_VALID_FILES["animated.gif"]())).convert("RGB").resize((32, 32)),
        dtype=int,
    )
    assert np.abs(pixels - rocket).mean() < 20  # The first frame (the rocket), not the second.
    assert current_files(out1) == current_files(out2)


def test_no_grey_padded_image_is_ever_written():
    from PIL import ImageFile

    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    for name, (factory, _) in HOSTILE_FILES.items():
        if name.startswith("truncated"):
            with pytest.raises(BadInputError):
                decode_image(factory(), max_pixels=10**8)


def test_a_40000_squared_png_header_is_refused_with_small_memory(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_header_bomb())
    script = textwrap.dedent(f"""
        import resource, pathlib
        from beam_jobs.imaging.decode import decode_image
        from beam_jobs.errors import BadInputError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decode_image(pathlib.Path({str(bomb)!r}).read_bytes(), max_pixels=100_000_000)
        except BadInputError as error:
            print(error.reason, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    reason, before_kb, after_kb = result.stdout.split()
    assert len(bomb.read_bytes()) < 120
    assert reason == "too_many_pixels"
    assert int(after_kb) - int(before_kb) < 10 * 1024  # Decoding it would need 4.8 GB.


def test_no_external_process_is_ever_started(monkeypatch):
    import os
    import subprocess as sp

    def refuse(*args, **kwargs):
        raise AssertionError(f"an external process was started: {args!r}")

    monkeypatch.setattr(sp, "Popen", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(os, "system", refuse)
    for name in ("postscript.jpg", "photoshop.jpg", "telescope.jpg"):
        with pytest.raises(BadInputError) as caught:
            decode_image(HOSTILE_FILES[name][0](), max_pixels=10**8)
        assert caught.value.reason == "format_not_allowed"
        assert name.split(".")[0] and caught.value.detail.startswith("looks like")


def test_malformed_exif_is_ignored_and_counted():
    decoded = decode_image(ODD_VALID_FILES["broken_exif.jpg"](), max_pixels=10**8)
    assert decoded.image.size == (64, 48)
    assert decoded.events == ["exif_malformed"]


# The documented colours of the mode matrix: (mode, how to make it, expected RGB of pixel (0, 0)).
MODE_MATRIX = [
    ("CMYK", lambda: Image.new("CMYK", (4, 4), (255, 0, 0, 0)), (0, 255, 255)),
    ("P+transparency", lambda: _palette_transparent(), (255, 255, 255)),
    ("LA", lambda: Image.new("LA", (4, 4), (10, 0)), (255, 255, 255)),
    ("RGBA", lambda: Image.new("RGBA", (4, 4), (255, 0, 0, 128)), (255, 127, 127)),
    ("I;16 max", lambda: Image.fromarray(np.full((4, 4), 65535, np.uint16)), (255, 255, 255)),
    ("I;16 mid", lambda: Image.fromarray(np.full((4, 4), 32768, np.uint16)), (128, 128, 128)),
    ("I;16 low", lambda: Image.fromarray(np.full((4, 4), 257, np.uint16)), (1, 1, 1)),
    ("1", lambda: Image.new("1", (4, 4), 1), (255, 255, 255)),
    ("F", lambda: Image.fromarray(np.full((4, 4), 0.25, np.float32)), (64, 64, 64)),
]


def _palette_transparent() -> Image.Image:
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 255, 0] * 256)
    image.info["transparency"] = 0
    return image


@pytest.mark.parametrize("name, make, rgb", MODE_MATRIX, ids=[m[0] for m in MODE_MATRIX])
def test_mode_matrix_gives_uint8_hwc_with_documented_colours(name, make, rgb):
    result = np.asarray(normalize_mode(make(), channels=3))
    assert result.dtype == np.uint8 and result.shape == (4, 4, 3)
    assert tuple(int(v) for v in result[0, 0]) == rgb


def test_a_header_bomb_is_refused_quoting_the_jobs_limit_and_flag_not_pillows():
    with pytest.raises(BadInputError) as caught:
        decode_image(_png_header_bomb(), max_pixels=100_000_000)
    assert caught.value.reason == "too_many_pixels"
    assert "1600000000 pixels is over --max_pixels=100000000" in caught.value.detail
    assert "178956970" not in caught.value.detail


@pytest.mark.parametrize("max_pixels, refused", [(200_000_000, False), (150_000_000, True)])
def test_max_pixels_above_pillows_own_limit_is_the_limit(max_pixels, refused):
    # 13,400 x 13,400 = 179,560,000 pixels: over Pillow's default refusal (178,956,970), of one
    # bit each, so that the file is small and a decode needs 180 MB.
    buffer = io.BytesIO()
    Image.new("1", (13_400, 13_400)).save(buffer, "PNG")
    if refused:
        with pytest.raises(BadInputError) as caught:
            decode_image(buffer.getvalue(), max_pixels=max_pixels)
        assert caught.value.detail.endswith("179560000 pixels is over --max_pixels=150000000")
    else:
        assert decode_image(buffer.getvalue(), max_pixels=max_pixels).image.size == (13_400, 13_400)
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's default, as it was before the decode

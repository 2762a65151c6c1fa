"""Split groups: near-copies found by their perceptual hashes, user groups, and one split per group."""

from __future__ import annotations

import io
import itertools
import random
from dataclasses import replace

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image, ImageEnhance, ImageFilter

from beam_jobs.errors import UsageError
from beam_jobs.imaging.perceptual_hash import perceptual_hash
from beam_jobs.planning.group_rules import (
    ASSIGNED,
    GIVEN,
    HELD,
    band_keys,
    connected_groups,
    group_edges,
    hamming,
    near_copies,
    one_split_per_group,
    pairs_in_band,
)
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.planning.transforms import PLAN_SUMMARY, PlanShards
from beam_jobs.records import InputFile
from beam_jobs.spec import SplitSpec
from tests.photos import encode, real_photo

MAX_PIXELS = 100_000_000


def _random_hashes(rng: random.Random, count: int, threshold: int) -> list[int]:
    """Random signatures, with a near-copy (a few bits flipped, up to the threshold and one beyond
    it) of every third one."""
    hashes = []
    colours = [rng.getrandbits(64) for _ in range(3)]  # few colours: the grey bits decide most pairs
    tones = [rng.randint(20, 200) << 8 | rng.randint(40, 200) for _ in range(3)]
    for _ in range(count):
        h = rng.choice(tones) << 128 | rng.getrandbits(64) << 64 | rng.choice(colours)
        hashes.append(h)
        if rng.random() < 1 / 3:
            flips = rng.sample(range(64, 128), rng.randint(0, threshold + 1))
            # one chromaticity byte a little off, or far off (then no near-copy), or none
            shade = rng.choice([0, 1 << 8 * rng.randint(0, 7), 0x80 << 8 * rng.randint(0, 7)])
            # the tone's mean or contrast a little off, or far off (then no near-copy), or neither
            tone = rng.choice([0, 3 << 128, 20 << 136, 20 << 128, 40 << 136])
            hashes.append((h ^ sum(1 << bit for bit in flips) ^ shade) + tone)
    return hashes


@pytest.mark.parametrize("threshold", [0, 3, 10, 16])
def test_bands_find_every_pair_within_the_threshold_exactly_once(threshold):
    rng = random.Random(threshold)
    named = [(f"{i:04d}.jpg", h) for i, h in enumerate(_random_hashes(rng, 150, threshold))]
    by_band: dict = {}
    for name, h in named:
        for key in band_keys(h, threshold):
            by_band.setdefault(key, []).append((name, h))
    found = [pair for (band, _), members in by_band.items() for pair in pairs_in_band(band, members, threshold)]
    brute = sorted(
        (a, b, hamming(x, y)) for (a, x), (b, y) in itertools.combinations(named, 2) if near_copies(x, y, threshold)
    )
    assert sorted(found) == brute  # every pair, and none twice
    assert any(
        hamming(x, y) <= threshold and not near_copies(x, y, threshold)
        for (_, x), (_, y) in itertools.combinations(named, 2)
    )
    assert any(d == threshold for _, _, d in brute) or threshold == 0


def test_bands_cover_all_64_bits_without_overlap():
    for threshold in range(0, 25):
        keys = band_keys(2**128 - 1, threshold)
        assert len(keys) == threshold + 1
        assert sum(bin(bits).count("1") for _, bits in keys) == 64


def test_groups_are_connected_components_named_by_their_smallest_member():
    groups = connected_groups([("c", "d"), ("b", "c"), ("x", "y"), ("d", "b")])
    assert groups == {"b": "b", "c": "b", "d": "b", "x": "x", "y": "x"}
    assert connected_groups(list(group_edges(["p3", "p1", "p2", "p1"]))) == {"p1": "p1", "p2": "p1", "p3": "p1"}


def test_a_new_input_near_held_examples_of_two_splits_is_a_dead_letter_not_a_leak():
    from beam_jobs.planning.append_joins import PLAN_DEAD_LETTERS
    from beam_jobs.planning.split_assignment import SPLIT_INPUTS, AssignSplits

    held = [
        InputFile("x/a.jpg", "/d/x/a.jpg", label="x", split="train", split_group="x/a.jpg"),
        InputFile("y/b.jpg", "/d/y/b.jpg", label="y", split="validation", split_group="x/a.jpg"),
        InputFile("z/e.jpg", "/d/z/e.jpg", label="z", split="validation", split_group="z/e.jpg"),
    ]
    new = [
        InputFile("x/c.jpg", "/d/x/c.jpg", label="x", split_group="x/a.jpg"),  # near a and b: no split is safe
        InputFile("x/g.jpg", "/d/x/g.jpg", label="x", split="train", split_group="x/a.jpg"),  # given: the user's
        InputFile("z/f.jpg", "/d/z/f.jpg", label="z", split_group="z/e.jpg"),  # near e only: e's split
    ]
    fractions = {"train": 0.5, "validation": 0.5}
    with TestPipeline(runner=FnApiRunner()) as p:
        out = (
            p
            | "New" >> beam.Create(new)
            | AssignSplits(fractions, "hash", grouped=True, held=p | "Held" >> beam.Create(held))
        )
        assert_that(
            out[SPLIT_INPUTS] | beam.Map(lambda f: (f.filename, f.split)),
            equal_to([("x/g.jpg", "train"), ("z/f.jpg", "validation")]),
            label="Splits",
        )
        assert_that(
            out[PLAN_DEAD_LETTERS] | beam.Map(lambda d: (d.uri, d.reason, "train: 'x/a.jpg'" in d.detail)),
            equal_to([("/d/x/c.jpg", "near_copy_across_splits", True)]),
            label="DeadLetters",
        )


def test_group_values_are_one_group_however_spelled():
    from beam_jobs.listing.names import clean_group

    assert {clean_group(v) for v in (7, 7.0, "7", " 7 ")} == {"7"}
    assert clean_group("caf\u00e9") == clean_group("cafe\u0301") == "caf\u00e9"
    # A missing value, as exports spell it, is no group (not one group of every row without one).
    missing = (float("nan"), float("inf"), "", "nan", "NaN", "NA", "N/A", "None", "null", "<NA>", "NaT", "#N/A")
    assert {clean_group(v) for v in missing} == {None}
    assert clean_group("nana") == "nana"
    assert clean_group(7.5) == "7.5" and clean_group("  ") is None and clean_group(None) is None


def test_a_group_takes_its_given_split_else_its_smallest_members():
    a = InputFile("a.jpg", "/a.jpg", label="cat", split="validation", split_group="a.jpg")
    b = InputFile("b.jpg", "/b.jpg", label="dog", split="train", split_group="a.jpg")
    c = InputFile("c.jpg", "/c.jpg", label="cat", split="train", split_group="a.jpg")
    settled = one_split_per_group([(c, False), (a, False), (b, False)])
    assert {f.filename: f.split for f in settled} == {
        "a.jpg": "validation",
        "b.jpg": "validation",
        "c.jpg": "validation",
    }
    settled = one_split_per_group([(c, True), (a, False), (b, False)])  # c's split was the user's
    assert {f.filename: f.split for f in settled} == {"a.jpg": "train", "b.jpg": "train", "c.jpg": "train"}
    # An example an append's version holds fixes the split over a given one: it is written already.
    d = InputFile("d.jpg", "/d.jpg", label="cat", split="test", split_group="a.jpg")
    settled = one_split_per_group([(c, GIVEN), (a, ASSIGNED), (b, ASSIGNED), (d, HELD)])
    assert {f.filename: f.split for f in settled} == {
        "a.jpg": "test",
        "b.jpg": "test",
        "c.jpg": "train",
        "d.jpg": "test",
    }


def _edited(image: Image.Image, rng: random.Random) -> bytes:
    """A near-copy as collections hold them: cropped a little, resized, brightened, blurred and re-saved."""
    w, h = image.size
    box = (round(rng.uniform(0, 0.03) * w), round(rng.uniform(0, 0.03) * h))
    image = image.crop((box[0], box[1], w - box[0], h - box[1]))
    scale = rng.uniform(0.6, 0.9)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.93, 1.07))
    image = image.filter(ImageFilter.GaussianBlur(0.6))
    return encode(image, "JPEG", quality=rng.randint(40, 85))


PHOTOS = [
    "astronaut",
    "chelsea",
    "coffee",
    "hubble_deep_field",
    "motorcycle_left",
    "retina",
    "rocket",
    "china",
    "flower",
]


def test_near_copies_of_real_photos_hash_close_and_distinct_photos_far():
    rng = random.Random(0)
    originals = {
        name: perceptual_hash(encode(real_photo(name), "JPEG", quality=92), max_pixels=MAX_PIXELS) for name in PHOTOS
    }
    for name in PHOTOS:
        copy = perceptual_hash(_edited(real_photo(name), rng), max_pixels=MAX_PIXELS)
        assert near_copies(originals[name], copy, 14), name
    for a, b in itertools.combinations(PHOTOS, 2):
        assert not near_copies(originals[a], originals[b], 14), (a, b)


def test_the_hash_is_of_the_upright_image():
    photo = real_photo("chelsea")
    upright = perceptual_hash(encode(photo, "JPEG", quality=90), max_pixels=MAX_PIXELS)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view": the pixels are stored turned the other way
    stored = encode(photo.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=90, exif=exif.tobytes())
    assert hamming(upright, perceptual_hash(stored, max_pixels=MAX_PIXELS)) <= 4
    turned = encode(photo.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=90)  # no tag: another image
    assert not near_copies(upright, perceptual_hash(turned, max_pixels=MAX_PIXELS), 14)


def test_smooth_images_of_other_colours_are_no_near_copies():
    """What the grey hash alone grouped: a yellow blur and a blue one of the same shape."""
    gradient = Image.linear_gradient("L").resize((320, 240))
    yellow = Image.merge("RGB", (gradient, gradient, gradient.point(lambda v: v // 4)))
    blue = Image.merge("RGB", (gradient.point(lambda v: v // 4), gradient.point(lambda v: v // 2), gradient))
    a, b = (perceptual_hash(encode(i, "JPEG", quality=90), max_pixels=MAX_PIXELS) for i in (yellow, blue))
    assert hamming(a, b) <= 14  # alike in grey: the grey hash alone would group them
    assert not near_copies(a, b, 14)
    brighter = perceptual_hash(
        encode(ImageEnhance.Brightness(yellow).enhance(1.1), "JPEG", quality=60), max_pixels=MAX_PIXELS
    )
    assert near_copies(a, brighter, 14)  # the colours' proportions, not their brightness


def test_the_tone_tells_apart_flat_images_the_grey_hash_and_colours_cannot():
    """A white sky and a grey wall of one tint hash alike in grey and in chromaticity: their
    tone (mean and contrast) is what differs; a brightness change of 10% stays within it."""
    gradient = np.asarray(Image.linear_gradient("L").resize((320, 240)), dtype=np.float32) / 255

    def flat(level: float, spread: float) -> Image.Image:
        grey = level + spread * (gradient - 0.5)
        return Image.fromarray(np.clip(np.stack([grey] * 3, axis=-1), 0, 255).astype(np.uint8))

    sky, wall, textured = flat(235, 12), flat(130, 12), flat(130, 90)
    a, b, c = (perceptual_hash(encode(i, "JPEG", quality=90), max_pixels=MAX_PIXELS) for i in (sky, wall, textured))
    for x, y in ((a, b), (b, c)):
        assert near_copies(x, y, 14, tone_steps=None)  # the legacy rule groups them
        assert not near_copies(x, y, 14)
    darker = perceptual_hash(
        encode(ImageEnhance.Brightness(wall).enhance(0.9), "JPEG", quality=60), max_pixels=MAX_PIXELS
    )
    assert near_copies(b, darker, 14)
    # The legacy signature is the same one without the tone bytes, which a signature never lacks.
    legacy = perceptual_hash(encode(wall, "JPEG", quality=90), max_pixels=MAX_PIXELS, tone=False)
    assert legacy == b & (2**128 - 1) and b >> 136 > 0


def test_bytes_that_are_no_image_have_no_hash():
    assert perceptual_hash(b"<html>403</html>", max_pixels=MAX_PIXELS) is None
    data = encode(real_photo("coffee"), "JPEG", quality=90)
    assert perceptual_hash(data, max_pixels=1000) is None  # more pixels than allowed: never decoded
    assert perceptual_hash(encode(real_photo("coffee"), "PNG"), max_pixels=MAX_PIXELS) is not None
    assert isinstance(perceptual_hash(io.BytesIO(data).getvalue(), max_pixels=MAX_PIXELS), int)


def _grouped_listing(seed: int) -> list[InputFile]:
    """A list of inputs with hashes (near-copies across classes and user groups included)."""
    rng = random.Random(seed)
    listing = []
    for index, h in enumerate(_random_hashes(rng, 120, 14)):
        label = rng.choice(["cat", "dog", "bird"])
        group = f"patient{rng.randint(0, 30)}" if rng.random() < 0.2 else None
        split = rng.choice(["train", "validation"]) if rng.random() < 0.05 else None
        listing.append(
            InputFile(
                f"{label}/{index:04d}.jpg", f"/d/{index:04d}.jpg", label=label, split=split, phash=h, user_group=group
            )
        )
    return listing


def _brute_force_groups(listing: list[InputFile], threshold: int) -> list[InputFile]:
    """The groups by comparing all pairs: what the bands must find without doing so."""
    edges = [
        (a.filename, b.filename)
        for a, b in itertools.combinations(listing, 2)
        if a.phash is not None and b.phash is not None and near_copies(a.phash, b.phash, threshold)
    ]
    by_user: dict = {}
    for f in listing:
        if f.user_group:
            by_user.setdefault(f.user_group, []).append(f.filename)
    for members in by_user.values():
        edges.extend(group_edges(members))
    groups = connected_groups(edges)
    return [replace(f, split_group=groups.get(f.filename)) for f in listing]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("split_rule", ["stratified", "hash"])
def test_plan_shards_with_groups_equals_the_in_memory_plan_and_no_group_spans_two_splits(seed, split_rule):
    listing = _grouped_listing(seed)
    settings = dict(
        split_fractions={"train": 0.6, "validation": 0.4},
        num_shards=2,
        example_bytes=20_000,
        target_shard_bytes=400_000,
        dedup="path",
        split_rule=split_rule,
    )
    expected = plan_dataset(_brute_force_groups(listing, 14), **settings)
    splits: dict = {}
    for shard in expected.shards:
        for f in shard.inputs:
            splits.setdefault(f.split_group or f.filename, set()).add(f.split)
    given = {f.filename for f in listing if f.split is not None}
    spanning = [group for group, names in splits.items() if len(names) > 1]
    # Only a group holding two splits the user gave may span two.
    for group in spanning:
        members = [f for shard in expected.shards for f in shard.inputs if f.split_group == group]
        assert len({f.split for f in members if f.filename in given}) > 1
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = (
            p
            | beam.Create(listing)
            | PlanShards(
                from_tree=False,
                tree_layout="auto",
                source="/d/list.csv",
                split_groups={"near_copy_bits": 14, "max_chroma_step": 13, "max_tone_steps": [30, 16]},
                **settings,
            )
        )
        assert_that(planned["shards"], equal_to(list(expected.shards)), label="Shards")
        assert_that(
            planned[PLAN_SUMMARY] | beam.Map(lambda s: s["split_groups"]["groups"]),
            equal_to([len({f.split_group for f in _brute_force_groups(listing, 14) if f.split_group})]),
            label="Groups",
        )


def test_group_settings_are_checked_and_recorded_only_when_asked_for():
    assert SplitSpec().group_settings() is None
    assert SplitSpec(groups="near_copies").group_settings() == {
        "method": "dct64+chroma4+tone2",
        "near_copy_bits": 14,
        "max_chroma_step": 13,
        "max_tone_steps": [30, 16],
    }
    # A dataset made with the signature before the tone keeps it (preflight.with_dataset_defaults).
    assert SplitSpec(groups="near_copies", near_copy_method="dct64+chroma4").group_settings() == {
        "method": "dct64+chroma4",
        "near_copy_bits": 14,
        "max_chroma_step": 13,
    }
    with pytest.raises(UsageError, match="near-copy method must be one of"):
        SplitSpec(groups="near_copies", near_copy_method="md5")
    assert SplitSpec(group_pattern="^(p[0-9]+)_").group_settings() == {"group_pattern": "^(p[0-9]+)_"}
    with pytest.raises(UsageError, match="exactly one capture group"):
        SplitSpec(group_pattern="p[0-9]+")
    with pytest.raises(UsageError, match="not a regular expression"):
        SplitSpec(group_pattern="(p")
    with pytest.raises(UsageError, match="--near_copy_bits must be between 0 and 24"):
        SplitSpec(groups="near_copies", near_copy_bits=40)
    with pytest.raises(UsageError, match="--split_groups"):
        SplitSpec(groups="faces")
    with pytest.raises(UsageError, match="--near_copy_bits 10 has no effect without --split_groups near_copies"):
        SplitSpec(near_copy_bits=10)
    # Stored in grey, a colour photo and its grey copy are one image: compared by the grey hash alone.
    assert SplitSpec(groups="near_copies").group_settings(grey=True)["max_chroma_step"] is None


def test_a_grey_copy_is_near_by_the_grey_hash_alone_and_16_bit_images_are_scaled_not_clipped():
    photo = real_photo("coffee")
    colour = perceptual_hash(encode(photo, "JPEG", quality=90), max_pixels=MAX_PIXELS)
    grey = perceptual_hash(encode(photo.convert("L"), "JPEG", quality=90), max_pixels=MAX_PIXELS)
    assert not near_copies(colour, grey, 14) and near_copies(colour, grey, 14, chroma_step=None)
    import numpy as np

    deep = Image.fromarray(np.asarray(photo.convert("L"), dtype=np.uint16) * 257)
    sixteen = perceptual_hash(encode(deep, "PNG"), max_pixels=MAX_PIXELS)
    assert near_copies(grey, sixteen, 6)  # Pillow's convert would clip it to white, a hash of noise
    other = perceptual_hash(
        encode(Image.fromarray(np.asarray(real_photo("rocket").convert("L"), dtype=np.uint16) * 257), "PNG"),
        max_pixels=MAX_PIXELS,
    )
    assert not near_copies(sixteen, other, 14)


# End to end: the command on real photographs and their near-copies.


def _tile(name: str, index: int) -> Image.Image:
    """One quarter of a real photograph: four distinct images per photo."""
    photo = real_photo(name)
    w, h = photo.width // 2, photo.height // 2
    left, top = (index % 2) * w, (index // 2) * h
    return photo.crop((left, top, left + w, top + h))


def _near_copy_tree(root) -> dict[str, int]:
    """A class per photo: its four quarters, and edited copies of two of them (named copy_*).
    Returns {relative path: perceptual hash} of every file."""
    rng = random.Random(1)
    hashes = {}
    for name in PHOTOS:
        (root / name).mkdir(parents=True)
        for index in range(4):
            tile = _tile(name, index)
            files = {f"{name}/tile{index}.jpg": encode(tile, "JPEG", quality=92)}
            if index < 2:
                files[f"{name}/copy_of_tile{index}.jpg"] = _edited(tile, rng)
            for path, data in files.items():
                (root / path).write_bytes(data)
                hashes[path] = perceptual_hash(data, max_pixels=MAX_PIXELS)
    return hashes


def _splits_of(out) -> dict[str, str]:
    from tests.lifecycle.checks import examples_of_manifest, manifest

    return {name: split for split, name, _ in examples_of_manifest(out, manifest(out))}


def _near_pairs(hashes: dict[str, int], threshold: int = 14) -> list[tuple[str, str]]:
    return [
        (a, b) for a, b in itertools.combinations(sorted(hashes), 2) if near_copies(hashes[a], hashes[b], threshold)
    ]


def _verify_leakage(out, *flags: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(out), "--leakage", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_near_copies_of_real_photos_never_span_two_splits(tmp_path):
    from tests.conftest import run_cli
    from tests.lifecycle.checks import manifest

    hashes = _near_copy_tree(tmp_path / "photos")
    pairs = _near_pairs(hashes)
    # Recall is measured by benchmarks/near_copies.py; here, enough copies are found to matter.
    assert len(pairs) >= 9, pairs
    common = ["--input", tmp_path / "photos", "--splits", "train=0.5,validation=0.5", "--image_size", "64"]

    run_cli(*common, "--output_dir", tmp_path / "plain")
    plain = _splits_of(tmp_path / "plain")
    assert any(plain[a] != plain[b] for a, b in pairs), "without groups, some near-copy should cross the split"

    run_cli(*common, "--output_dir", tmp_path / "grouped", "--split_groups", "near_copies")
    grouped = _splits_of(tmp_path / "grouped")
    assert len(grouped) == len(hashes)
    assert [(a, b) for a, b in pairs if grouped[a] != grouped[b]] == []
    report = manifest(tmp_path / "grouped")["split_groups"]
    assert report["near_copy_pairs"] == len(pairs)
    assert report["pairs_across_splits"] == 0
    assert report["method"] == "dct64+chroma4+tone2" and report["near_copy_bits"] == 14
    counts = {split: sum(1 for s in grouped.values() if s == split) for split in ("train", "validation")}
    assert min(counts.values()) >= 0.35 * len(hashes), counts  # groups are small: near the fractions

    info = manifest(tmp_path / "grouped")
    assert info["features"]["image/near_copy/signature"] == {"dtype": "string", "shape": []}
    checked = _verify_leakage(tmp_path / "grouped")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"leakage: 0 near-copy pair(s) across splits among {len(hashes)} example(s), by the signatures stored" in (
        checked.stdout
    )
    leaky = _verify_leakage(tmp_path / "plain")  # made before groups: signatures of the stored images
    assert leaky.returncode == 1 and "LEAK " in leaky.stderr and "(an estimate)" in leaky.stdout, leaky.stdout

    # An append of near-copies of held examples puts each beside its original: the held signatures
    # are read from the sidecars, and the held examples never move.
    rng = random.Random(2)
    added = {}
    for name in PHOTOS:
        for index in (2, 3):
            path = f"{name}/later_copy_of_tile{index}.jpg"
            data = _edited(_tile(name, index), rng)
            (tmp_path / "photos" / path).write_bytes(data)
            added[path] = perceptual_hash(data, max_pixels=MAX_PIXELS)
    later = [(a, b) for a, b in _near_pairs({**hashes, **added}) if (a in added) != (b in added)]
    assert len(later) >= 4, later
    run_cli(*common, "--output_dir", tmp_path / "grouped", "--split_groups", "near_copies", "--append")
    appended = _splits_of(tmp_path / "grouped")
    assert len(appended) == len(hashes) + len(added)
    assert {name: appended[name] for name in grouped} == grouped  # nothing held moved
    assert [(a, b) for a, b in later if appended[a] != appended[b]] == []
    assert manifest(tmp_path / "grouped")["split_groups"]["pairs_across_splits"] == 0
    checked = _verify_leakage(tmp_path / "grouped")
    assert checked.returncode == 0 and "leakage: 0 near-copy pair(s)" in checked.stdout, checked.stdout
    # inspect-tfrecords draws the largest groups, each member captioned with its split.
    import json
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.inspect", str(tmp_path / "grouped"), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    largest = manifest(tmp_path / "grouped")["split_groups"]["largest_groups"]
    sheets = sorted((tmp_path / "report").glob("group_sheet-*.png"))
    assert len(sheets) == min(3, sum(1 for entry in largest if entry["inputs"] > 1)) >= 1
    for sheet, entry in zip(sheets, largest, strict=False):
        tiles = json.loads(Image.open(sheet).text["tiles"])
        assert len(tiles) == min(entry["inputs"], 24)
        assert len({tile["label"].split(":")[0] for tile in tiles}) == 1  # one split
        assert {appended[tile["filename"]] for tile in tiles} == {tiles[0]["label"].split(":")[0]}
    assert 'id="group-sheet-1"' in (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    # The check uses the dataset's own threshold (0 too), and a damaged shard is one line, no traceback.
    import shutil

    run_cli(*common, "--output_dir", tmp_path / "exact", "--split_groups", "near_copies", "--near_copy_bits", "0")
    exact = _verify_leakage(tmp_path / "exact")
    assert exact.returncode == 0 and "at 0 bits" in exact.stdout, exact.stdout + exact.stderr
    # ... and another on request: near-copies the 0-bit groups let apart are found at 14.
    exact_at_14 = _verify_leakage(tmp_path / "exact", "--near_copy_bits", "14")
    assert exact_at_14.returncode == 1 and "at 14 bits" in exact_at_14.stdout and "LEAK " in exact_at_14.stderr
    wrong = _verify_leakage(tmp_path / "exact", "--near_copy_bits", "30")
    assert wrong.returncode == 2 and "30 is not between 0 and 24 bits" in wrong.stderr, wrong.stderr
    shutil.copytree(tmp_path / "grouped", tmp_path / "damaged")
    next((tmp_path / "damaged" / "shards").rglob("train-*.tfrecord")).unlink()
    damaged = _verify_leakage(tmp_path / "damaged")
    assert damaged.returncode == 1 and "ERROR leakage not checked" in damaged.stderr, damaged.stderr
    assert "Traceback" not in damaged.stderr
    # Groups are part of the settings: an append that leaves them out is refused, not a leak.
    refused = run_cli(*common, "--output_dir", tmp_path / "grouped", "--append", check=False)
    assert refused.returncode != 0 and "made with other settings" in refused.stderr, refused.stderr


@pytest.mark.slow
def test_a_group_column_and_a_group_pattern_keep_each_group_in_one_split(tmp_path):
    from tests.conftest import run_cli

    photos = tmp_path / "photos"
    rows = ["uri,label,split,group"]
    for n, name in enumerate(PHOTOS):
        for index in range(4):
            patient = f"p{(n * 4 + index) % 7}"
            path = photos / name / f"{patient}_{index}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(encode(_tile(name, index), "JPEG", quality=90))
            rows.append(f"{path},{name},,{patient}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    common = ["--splits", "train=0.5,validation=0.5", "--image_size", "64"]

    run_cli("--manifest", tmp_path / "list.csv", "--output_dir", tmp_path / "by_column", *common)
    run_cli("--input", photos, "--output_dir", tmp_path / "by_pattern", "--group_pattern", r"/(p[0-9]+)_", *common)
    for out in ("by_column", "by_pattern"):
        splits = _splits_of(tmp_path / out)
        assert len(splits) == len(PHOTOS) * 4
        by_patient: dict = {}
        for name, split in splits.items():
            by_patient.setdefault(name.split("/")[-1].split("_")[0], set()).add(split)
        assert all(len(s) == 1 for s in by_patient.values()), (out, by_patient)
        assert {s for (s,) in by_patient.values()} == {"train", "validation"}, out

    # A pattern that matches nothing says so.
    typo = run_cli("--input", photos, "--output_dir", tmp_path / "typo", "--group_pattern", r"/(P[0-9]+)_", *common)
    assert "--group_pattern '/(P[0-9]+)_' matched no input's relative path" in typo.stderr + typo.stdout

    # An append's new members of held groups take their group's split, however many are new.
    before = {out: _splits_of(tmp_path / out) for out in ("by_column", "by_pattern")}
    new_rows = []
    for index, patient in enumerate(["p1", "p2", "p3", "p4", "p5", "p6", "p0", "p1"]):
        extra = photos / "chelsea" / f"{patient}_{10 + index}.jpg"
        extra.write_bytes(encode(_tile(PHOTOS[index % len(PHOTOS)], 3).rotate(90, expand=True), "JPEG", quality=80))
        new_rows.append(f"{extra},chelsea,,{patient}")
    (tmp_path / "more.csv").write_text("\n".join([*rows, *new_rows]) + "\n", encoding="utf-8")
    run_cli("--manifest", tmp_path / "more.csv", "--output_dir", tmp_path / "by_column", "--append", *common)
    pattern = ["--group_pattern", r"/(p[0-9]+)_"]
    run_cli("--input", photos, "--output_dir", tmp_path / "by_pattern", *pattern, "--append", *common)
    for out in ("by_column", "by_pattern"):
        splits = _splits_of(tmp_path / out)
        assert len(splits) == len(PHOTOS) * 4 + len(new_rows), out
        assert {name: splits[name] for name in before[out]} == before[out], out
        patient_split = {name.split("/")[-1].split("_")[0]: split for name, split in before[out].items()}
        for name, split in splits.items():
            if name not in before[out]:
                assert split == patient_split[name.split("/")[-1].split("_")[0]], (out, name)
    # A held row moved to another group would have to move split: the append names it, converts nothing.
    moved = [rows[0], rows[1].rsplit(",", 1)[0] + ",p99", *rows[2:], *new_rows]
    (tmp_path / "moved.csv").write_text("\n".join(moved) + "\n", encoding="utf-8")
    refused = run_cli(
        "--manifest", tmp_path / "moved.csv", "--output_dir", tmp_path / "by_column", "--append", *common, check=False
    )
    assert refused.returncode != 0 and "changed (content, label, annotations, group or split)" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Kept as held (--changed_sources keep), a moved row keeps its example and split, and is in the
    # group its row names now: that group's new members take its split, never the other one.
    held_splits = _splits_of(tmp_path / "by_column")
    moved, joined = list(rows), []
    for k in range(6):
        moved[1 + k] = rows[1 + k].rsplit(",", 1)[0] + f",q{k}"
        extra = photos / "chelsea" / f"q{k}_new.jpg"
        extra.write_bytes(encode(_tile(PHOTOS[k % len(PHOTOS)], 2).rotate(270, expand=True), "JPEG", quality=70))
        joined.append((rows[1 + k].split(",")[0], extra))
    (tmp_path / "kept.csv").write_text(
        "\n".join([*moved, *new_rows, *(f"{extra},chelsea,,q{k}" for k, (_, extra) in enumerate(joined))]) + "\n",
        encoding="utf-8",
    )
    run_cli(
        "--manifest", tmp_path / "kept.csv", "--output_dir", tmp_path / "by_column", "--append", *common,
        "--changed_sources", "keep",
    )  # fmt: skip
    splits = _splits_of(tmp_path / "by_column")
    assert {name: splits[name] for name in held_splits} == held_splits  # nothing held moved
    for held_path, extra in joined:
        held_split = next(split for name, split in splits.items() if held_path.endswith("/" + name))
        new_split = next(split for name, split in splits.items() if str(extra).endswith("/" + name))
        assert held_split == new_split, (held_path, extra, splits)
    from tests.lifecycle.checks import manifest

    assert manifest(tmp_path / "by_column")["split_groups"]["groups_across_splits"] == 0


@pytest.mark.slow
def test_a_dropped_copy_keeps_its_group_in_the_split_of_the_input_it_copies(tmp_path):
    """Patient b's photo that is byte for byte patient a's: --dedup content drops it (or an append
    drops it as held), but a and b are then one group, so b's other photos share a's split. Six
    such pairs: were the dropped copy's group lost, they would all share one by chance 1 in 64."""
    from tests.conftest import run_cli

    photos, rows_a, rows_b = tmp_path / "photos", [], []
    for k, name in enumerate(PHOTOS[:6]):
        for index in range(4):
            path = photos / name / f"a{k}_{index}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(encode(_tile(name, index), "JPEG", quality=90))
        rows_a += [f"{photos}/{name}/a{k}_0.jpg,{name},a{k}", f"{photos}/{name}/a{k}_1.jpg,{name},a{k}"]
        rows_a.append(f"{photos}/{name}/a{k}_3.jpg,{name},")  # in no group
        (photos / name / f"b{k}_copy.jpg").write_bytes((photos / name / f"a{k}_0.jpg").read_bytes())
        rows_b += [f"{photos}/{name}/b{k}_copy.jpg,{name},b{k}", f"{photos}/{name}/a{k}_2.jpg,{name},b{k}"]
    common = ["--splits", "train=0.5,validation=0.5", "--image_size", "32"]

    def write(name: str, rows: list[str]):
        (tmp_path / name).write_text("\n".join(["uri,label,group", *rows]) + "\n", encoding="utf-8")
        return tmp_path / name

    def same_split_per_pair(out) -> None:
        splits = _splits_of(out)
        assert not any("copy" in name for name in splits), splits  # the copies are dead letters
        for k, name in enumerate(PHOTOS[:6]):
            pair = {splits[f"photos/{name}/a{k}_{index}.jpg"] for index in range(3)}
            assert len(pair) == 1, (k, splits)
        assert set(splits.values()) == {"train", "validation"}, splits

    run_cli("--manifest", write("all.csv", [*rows_a, *rows_b]), "--output_dir", tmp_path / "dedup",
            "--dedup", "content", *common)  # fmt: skip
    same_split_per_pair(tmp_path / "dedup")
    run_cli("--manifest", write("a.csv", rows_a), "--output_dir", tmp_path / "appended", *common)
    run_cli("--manifest", write("all.csv", [*rows_a, *rows_b]), "--output_dir", tmp_path / "appended",
            "--append", *common)  # fmt: skip
    same_split_per_pair(tmp_path / "appended")


@pytest.mark.slow
def test_a_group_given_two_splits_is_reported(tmp_path):
    from tests.conftest import run_cli
    from tests.lifecycle.checks import manifest

    rows = ["uri,label,split,group"]
    for index in range(4):
        path = tmp_path / "photos" / f"{index}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode(_tile("chelsea", index), "JPEG", quality=90))
        rows.append(f"{path},cat,{['train', 'validation', '', ''][index]},p1")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    run_cli("--manifest", tmp_path / "list.csv", "--output_dir", tmp_path / "out", "--image_size", "32")
    info = manifest(tmp_path / "out")
    assert info["split_groups"]["groups_across_splits"] == 1
    assert any(
        "1 group(s) hold inputs whose splits were given (split folders, a split column) or written" in w
        for w in info["warnings"]
    )
    # The leakage check reads each example's user group from the sidecars: the group is a leak.
    checked = _verify_leakage(tmp_path / "out")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "leakage: 1 user group(s) across splits, by the shards' sidecars" in checked.stdout
    assert "LEAK group 'p1' spans train, validation (train: " in checked.stderr, checked.stderr


def test_a_dataset_made_with_the_signature_before_the_tone_keeps_it_when_appended_to(tmp_path):
    """A dataset made with the legacy signature (16 bytes, no tone) appends with it: the same
    settings (not refused as other ones), 16-byte signatures in the new examples, the legacy rule."""
    import tensorflow as tf

    import beam_jobs
    from beam_jobs.config import ImageConfig
    from beam_jobs.planning.group_rules import LEGACY_PERCEPTUAL_HASH
    from tests.conftest import run_cli
    from tests.lifecycle.checks import manifest

    _near_copy_tree(tmp_path / "photos")
    spec = beam_jobs.ConversionSpec(
        source=beam_jobs.Source(root=str(tmp_path / "photos")),
        output_dir=str(tmp_path / "out"),
        image=ImageConfig(width=64, height=64),
        splits=beam_jobs.SplitSpec(
            fractions={"train": 0.5, "validation": 0.5}, groups="near_copies", near_copy_method=LEGACY_PERCEPTUAL_HASH
        ),
        runner_args=("--direct_num_workers=1",),
    )
    beam_jobs.convert(spec=spec)
    assert manifest(tmp_path / "out")["split_groups"]["method"] == LEGACY_PERCEPTUAL_HASH
    (tmp_path / "photos" / PHOTOS[0] / "added_copy.jpg").write_bytes(_edited(_tile(PHOTOS[0], 0), random.Random(5)))
    run_cli(
        "--input", tmp_path / "photos", "--output_dir", tmp_path / "out", "--splits", "train=0.5,validation=0.5",
        "--image_size", "64", "--split_groups", "near_copies", "--append",
    )  # fmt: skip
    info = manifest(tmp_path / "out")
    assert info["split_groups"]["method"] == LEGACY_PERCEPTUAL_HASH and "max_tone_steps" not in info["split_groups"]
    lengths = set()
    for split in info["splits"].values():
        for shard in split["shards"]:
            for record in tf.data.TFRecordDataset(str(tmp_path / "out" / shard["file"])):
                example = tf.train.Example.FromString(record.numpy())
                lengths.add(len(example.features.feature["image/near_copy/signature"].bytes_list.value[0]))
    assert lengths == {16}
    assert _verify_leakage(tmp_path / "out").returncode == 0


def test_an_image_over_pillows_own_limit_is_signed_within_the_jobs(monkeypatch):
    """--max_pixels above Pillow's default limit converts such an image; its signature must not
    fail on Pillow's limit, or its copies would be in no group (and free to cross splits)."""
    data = encode(real_photo("coffee"), "JPEG", quality=90)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the photo is far over twice this
    assert perceptual_hash(data, max_pixels=MAX_PIXELS) is not None
    assert Image.MAX_IMAGE_PIXELS == 1000  # put back
    assert perceptual_hash(data, max_pixels=1000) is None  # over the job's own limit: no signature


def test_the_leakage_check_estimates_examples_whose_source_gave_no_signature(tmp_path):
    import tensorflow as tf

    import tfdata_readers
    from tests.conftest import run_cli
    from tfdata_readers.checking.leakage import leakage_command_lines

    hashes = _near_copy_tree(tmp_path / "photos")
    out = tmp_path / "out"
    run_cli("--input", tmp_path / "photos", "--output_dir", out, "--image_size", "64", "--split_groups", "near_copies")
    info = tfdata_readers.load_manifest(out)
    shard = info.split("train").shards[0].path
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shard)]
    records[0].features.feature["image/near_copy/signature"].bytes_list.value[0] = b""
    with tf.io.TFRecordWriter(shard) as writer:
        for example in records:
            writer.write(example.SerializeToString())
    pairs, lines = leakage_command_lines(info)
    assert pairs == 0, lines
    assert f"among {len(hashes)} example(s)" in lines[0], lines
    assert "1 example(s) whose source gave no signature, by signatures of their stored images" in lines[0], lines


def test_inputs_dead_lettered_across_two_splits_are_not_counted_among_the_inputs_split():
    import collections

    from beam_jobs.errors import Reason
    from beam_jobs.planning.plan_facts import PlanFacts, plan_summary

    facts = PlanFacts(
        listed=3,
        unsplit=3,
        classes=collections.Counter({("train", "cat"): 1}),
        dead=collections.Counter({Reason.NEAR_COPY_ACROSS_SPLITS: 2}),
    )
    plan = {
        "facts": facts,
        "layout": {"train": {"count": 1, "num_shards": 1}},
        "label_names": ("cat",),
        "annotated": (),
    }
    summary = plan_summary(plan, {}, source="/d", requested={"train": 0.5, "validation": 0.5}, split_rule="stratified")
    said = [w for w in summary["warnings"] if w.startswith("--splits asks for 'validation'")]
    assert said == [
        "--splits asks for 'validation', but none of the 1 inputs without a split went to it "
        "(too few inputs for its fraction)"
    ], summary["warnings"]


def test_the_report_counts_as_members_only_inputs_that_took_a_split():
    from beam_jobs.planning.split_groups import split_group_report

    # a.jpg and b.jpg (held, train and validation) are near a new input only, dead-lettered as a
    # bridge between two splits: without it they are no group, and nothing spans two splits.
    # The members of a user group stay one group, whichever of them were dead-lettered.
    report = split_group_report(
        [("a.jpg", "bridge.jpg"), ("b.jpg", "bridge.jpg"), ("c.jpg", "d.jpg")],
        [("p1", ("e.jpg", "f.jpg", "gone.jpg", "h.jpg"))],
        {name: "train" for name in ("a.jpg", "c.jpg", "d.jpg", "e.jpg", "f.jpg", "h.jpg")} | {"b.jpg": "validation"},
        method="dct64+chroma4+tone2",
        threshold=14,
    )
    assert report["largest_groups"] == [
        {"id": "e.jpg", "inputs": 3, "members": ["e.jpg", "f.jpg", "h.jpg"]},
        {"id": "c.jpg", "inputs": 2, "members": ["c.jpg", "d.jpg"]},
    ]
    assert report["grouped_inputs"] == 5 and report["groups_across_splits"] == 0
    assert report["near_copy_pairs"] == 1 and report["pairs_across_splits"] == 0


def test_a_group_pattern_that_forms_no_group_says_why():
    from beam_jobs.planning.split_groups import group_warnings

    report = {"group_pattern": "/(p[0-9]+_[0-9]+)", "groups_across_splits": 0}
    assert group_warnings(report, user_inputs=0, user_groups=0) == [
        "--group_pattern '/(p[0-9]+_[0-9]+)' matched no input's relative path: no user group was formed, "
        "and inputs are split one by one (check its case and slashes)"
    ]
    (said,) = group_warnings(report, user_inputs=12, user_groups=0)
    assert said.startswith("--group_pattern '/(p[0-9]+_[0-9]+)' captured a different value in each of the 12 paths")
    assert group_warnings(report, user_inputs=12, user_groups=3) == []


def test_a_dropped_copys_group_takes_in_the_input_kept():
    from beam_jobs.planning.group_rules import copy_memberships

    kept = InputFile("a.jpg", "/a.jpg", label="cat", user_group="p1")
    rows = [kept, InputFile("b.jpg", "/b.jpg", label="cat", user_group="p2"), InputFile("c.jpg", "/c.jpg", label="cat")]
    rows.append(InputFile("d.jpg", "/d.jpg", label="cat", user_group="p1"))
    assert copy_memberships(kept, rows) == [("p2", "a.jpg")]
    assert copy_memberships(None, rows) == []


def test_a_split_no_input_went_to_names_the_largest_group_when_there_are_groups():
    from beam_jobs.planning.transforms import _with_group_cause

    said = (
        "--splits asks for 'validation', but none of the 82 inputs without a split went to it "
        "(too few inputs for its fraction)"
    )
    grouped = {"largest_groups": [{"id": "c/a.jpg", "inputs": 82, "members": []}]}
    assert _with_group_cause(said, grouped).endswith(
        "went to it (too few inputs or groups for its fraction: a group is never cut, and the largest, 'c/a.jpg', "
        "has 82 inputs)"
    )
    assert _with_group_cause(said, {"largest_groups": []}) == said

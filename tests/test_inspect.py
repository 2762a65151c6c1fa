"""Inspection of a dataset the job really wrote: class counts, pictures, and report.html in a real browser."""

from __future__ import annotations

import collections
import itertools
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageDraw, ImageFont

import tfdata_readers as tfr
from tests.browser import BROWSER_NAMES, Chromium, find_browser
from tests.conftest import REPO, run_cli
from tfdata_readers.checking.verification import _read_records
from tfdata_readers.inspect import PROG
from tfdata_readers.inspect import main as inspect_main
from tfdata_readers.inspection.class_chart import balance, chart_size
from tfdata_readers.inspection.gather import gather
from tfdata_readers.inspection.sheet import TILES_CHUNK, _fit, draw_contact_sheet, sheet_layout
from tfdata_readers.inspection.units import format_mib, plural
from tfdata_readers.sources.records import tensorflow_reason

SEED = 3
N = 12


def _inspect(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfdata_readers.inspect", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def dataset(photo_tree, tmp_path_factory) -> pathlib.Path:
    """The job's output for 36 real photos in 9 classes plus 7 broken files (dead letters)."""
    out = tmp_path_factory.mktemp("inspected") / "data"
    run_cli(
        "--input",
        photo_tree[0],
        "--output_dir",
        out,
        "--image_size",
        "64x48",
        "--num_shards",
        "2",
        "--splits",
        "train=0.75,validation=0.25",
        "--max_bad_fraction",
        "0.5",
    )
    return out


@pytest.fixture(scope="module")
def inspected(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    result = _inspect(dataset, "--out", out, "--num_examples", N, "--seed", SEED, "--augmented")
    return out, result


@pytest.fixture(scope="module")
def browser():
    binary = find_browser()
    if binary is None:
        pytest.fail(
            f"no headless Chromium found (looked for $CHROME_BIN and {', '.join(BROWSER_NAMES)} on PATH): "
            "install Debian's chromium-headless-shell (apt-get install chromium-headless-shell), which "
            "./run_tests.sh does when it is missing and apt-get may, or set CHROME_BIN"
        )
    with Chromium(binary) as chromium:
        yield chromium


def _labels_in_records(data_dir: pathlib.Path, split: str) -> collections.Counter:
    info = json.loads((data_dir / "dataset_info.json").read_text())
    spec = {"image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    counts = collections.Counter()
    for shard in info["splits"][split]["shards"]:
        for record in tf.data.TFRecordDataset(str(data_dir / shard["file"])):
            counts[int(tf.io.parse_single_example(record, spec)["image/class/label"])] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "validation"])
def test_class_counts_are_those_of_the_records_and_fit_class_weight(dataset, split):
    counts = tfr.class_counts(dataset, split)
    info = tfr.load_manifest(dataset)
    assert list(counts) == list(range(info.num_classes))  # every class, zeros included, in id order
    assert {k: v for k, v in counts.items() if v} == dict(_labels_in_records(dataset, split))
    assert sum(counts.values()) == tfr.num_examples(dataset, split)


@pytest.mark.slow
def test_the_job_records_dead_letters_per_split(dataset, photo_tree):
    info = json.loads((dataset / "dataset_info.json").read_text())
    per_split = collections.Counter()
    for split in info["splits"].values():
        per_split.update(split["dead_letters_by_reason"])
    assert dict(per_split) == info["dead_letters_by_reason"] == dict(collections.Counter(photo_tree[2].values()))


@pytest.mark.parametrize(
    "count, augmented, columns, rows", [(64, False, 8, 8), (12, True, 4, 3), (5, False, 5, 1), (0, False, 1, 1)]
)
def test_sheet_layout(count, augmented, columns, rows):
    layout = sheet_layout(count, image_size=(48, 64), tile=160, augmented=augmented)
    assert (layout.columns, layout.rows, len(layout.tiles)) == (columns, rows, count)
    assert layout.picture == (160, 120)  # the longer side fills the tile, the aspect ratio is kept
    for left, top, right, bottom in layout.tiles:
        assert 0 <= left < right <= layout.width and 0 <= top < bottom <= layout.height
        assert right - left == (2 * 160 + 5 if augmented else 160)
    boxes = sorted(layout.tiles)
    assert all(a[2] <= b[0] or a[3] <= b[1] or b[3] <= a[1] for a, b in itertools.pairwise(boxes))  # no overlap


def test_balance_flags_empty_classes():
    assert balance({"a": 10, "b": 2, "c": 0}) == balance({"c": 0, "b": 2, "a": 10})
    summary = balance({"a": 10, "b": 2, "c": 0})
    assert (summary.ratio, summary.largest, summary.smallest, summary.empty) == (5.0, "a", "b", ("c",))
    assert balance({"a": 0}).ratio is None


@pytest.mark.slow
def test_contact_sheets_show_the_seeded_sample_with_its_labels(dataset, inspected):
    out, result = inspected
    assert result.returncode == 0, result.stderr[-3000:]
    report = gather(dataset, num_examples=N, seed=SEED, augmented=True)
    for split, sample in report.samples.items():
        examples = sample.examples
        assert len(examples) == min(N, tfr.num_examples(dataset, split)) and sample.error is None
        sheet = Image.open(out / f"contact_sheet-{split}.png")
        layout = sheet_layout(len(examples), image_size=(48, 64), augmented=True)
        assert sheet.size == (layout.width, layout.height)
        tiles = json.loads(sheet.text[TILES_CHUNK])
        assert [(t["label"], t["filename"]) for t in tiles] == [(e.label, e.filename) for e in examples]
        assert all(t["filename"].split("/")[0] == t["label"] for t in tiles)  # the tree's folder is the class
        pixels = np.asarray(sheet.convert("RGB"), np.float32)
        for tile, example in zip(tiles, examples, strict=True):
            left, top, _, bottom = tile["box"]
            stored = np.asarray(
                Image.fromarray(example.image).resize(layout.picture, Image.Resampling.LANCZOS), np.float32
            )
            shown = pixels[top:bottom, left : left + layout.picture[0]]
            assert np.abs(shown - stored).mean() < 2.0, tile  # this tile shows this example
            assert example.augmented is not None and example.augmented.shape == example.image.shape
            caption = pixels[bottom + 2 : bottom + 34, left : left + layout.picture[0]]
            assert (caption < 128).any(), tile  # text was drawn under it
    # The same seed draws the same sample; another seed another one.
    again = gather(dataset, num_examples=N, seed=SEED)
    other = gather(dataset, num_examples=N, seed=SEED + 1)
    names = lambda r: [e.filename for e in r.samples["train"].examples]  # noqa: E731
    assert names(again) == names(report) != names(other)


@pytest.mark.slow
def test_class_chart_and_text_summary(dataset, inspected):
    out, result = inspected
    info = tfr.load_manifest(dataset)
    assert Image.open(out / "class_counts.png").size == chart_size(len(info.splits), info.num_classes)
    lines = result.stdout.splitlines()
    assert f"{sum(s.num_examples for s in info.splits.values())} examples in 2 splits, 9 classes" in lines[0]
    empty = [info.label_names[i] for i, n in tfr.class_counts(dataset, "validation").items() if n == 0]
    validation = next(line for line in lines if line.strip().startswith("validation"))
    assert (f"EMPTY classes: {', '.join(empty)}" in validation) if empty else "EMPTY" not in validation
    assert "problems: 0" in lines and lines[-1].startswith("wrote ")


@pytest.mark.slow
def test_report_opens_in_a_real_browser_with_the_manifests_numbers(dataset, inspected, browser, tmp_path):
    out, _ = inspected
    info = json.loads((dataset / "dataset_info.json").read_text())
    browser.open(out / "report.html")
    assert browser.console_errors() == []
    images = browser.evaluate(
        "Array.from(document.images).map(i => ({id: i.id, w: i.naturalWidth, "
        "h: i.naturalHeight, src: i.src.slice(0, 15)}))"
    )
    assert sorted(i["id"] for i in images) == ["class-counts", "contact-sheet-train", "contact-sheet-validation"]
    assert all(i["w"] > 0 and i["h"] > 0 and i["src"].startswith("data:image/") for i in images), images
    table = (
        "id => Array.from(document.querySelectorAll(`#${id} tbody tr`))"
        ".map(r => Array.from(r.cells).map(c => c.textContent))"
    )
    shards = browser.evaluate(f"({table})('shards')")
    expected = [
        [split, s["file"], str(s["num_examples"]), format_mib(s["bytes"]), "verified"]
        for split, meta in sorted(info["splits"].items())
        for s in meta["shards"]
    ]
    assert shards == expected
    classes = browser.evaluate(f"({table})('classes')")
    assert classes == [
        [str(i), name] + [str(info["splits"][s]["class_counts"][name]) for s in sorted(info["splits"])]
        for i, name in enumerate(info["label_names"])
    ]
    dead = browser.evaluate(f"({table})('dead-letters')")
    assert {row[0]: int(row[1]) for row in dead} == info["dead_letters_by_reason"]
    card = dict(browser.evaluate(f"({table})('card')"))
    assert card["producer"] == f"images-to-tfrecords {info['producer']['version']}"
    assert card["examples"] == str(sum(s["num_examples"] for s in info["splits"].values()))
    assert "Every shard verified" in browser.evaluate("document.getElementById('status').textContent")
    shot = Image.open(browser.screenshot(tmp_path / "report.png"))
    assert shot.width >= 1000 and shot.height > 1500  # the whole page, pictures included


@pytest.mark.slow
def test_a_damaged_dataset_gets_a_report_that_says_so(dataset, browser, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(dataset, damaged)
    info = json.loads((damaged / "dataset_info.json").read_text())
    missing = info["splits"]["train"]["shards"][0]["file"]
    truncated = info["splits"]["validation"]["shards"][1]["file"]
    (damaged / missing).unlink()
    data = (damaged / truncated).read_bytes()
    (damaged / truncated).write_bytes(data[: len(data) // 2])
    out = tmp_path / "report"
    result = _inspect(damaged, "--out", out, "--num_examples", 8)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"train/{missing}: missing" in result.stdout
    assert f"validation/{truncated}:" in result.stdout
    browser.open(out / "report.html")
    assert browser.console_errors() == []
    status = browser.evaluate("document.getElementById('status').textContent")
    assert "problem(s) found" in status and missing in status and truncated in status
    rows = {
        r[1]: r[4]
        for r in browser.evaluate(
            "Array.from(document.querySelectorAll('#shards tbody tr')).map(r => Array.from(r.cells).map(c => "
            "c.textContent))"
        )
    }
    assert rows[missing] == "missing" and rows[truncated] != "verified"
    assert sum(r == "verified" for r in rows.values()) == len(rows) - 2
    assert all(w > 0 for w in browser.evaluate("Array.from(document.images).map(i => i.naturalWidth)"))


def _run_main(capsys, *args) -> tuple[int, str, str]:
    try:
        code = inspect_main([str(a) for a in args])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "out, expected",
    [
        ("afile", "--out {tmp}/afile is a file, not a folder"),
        ("afile/sub", "--out {tmp}/afile/sub lies under {tmp}/afile, which is a file"),
    ],
)
def test_an_out_that_is_a_file_is_refused_in_one_line_before_reading(tmp_path, capsys, out, expected):
    (tmp_path / "afile").write_text("")
    code, _, err = _run_main(capsys, tmp_path / "no-dataset-here", "--out", tmp_path / out)
    assert (code, err) == (2, f"{PROG}: error: {expected.format(tmp=tmp_path)}\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-examples", "4"], "unrecognized argument --num-examples; did you mean --num_examples?"),
        (["--num", "4"], "unrecognized argument --num; did you mean --num_examples?"),  # no abbreviations
        (["--augment"], "unrecognized argument --augment; did you mean --augmented?"),
        (["--num_examples", "9", "--scan", "5"], "--num_examples 9 is more than --scan 5"),
    ],
)
def test_flag_errors_are_one_line_and_name_what_was_given(tmp_path, capsys, args, message):
    code, _, err = _run_main(capsys, tmp_path, "--out", tmp_path / "o", *args)
    assert (code, err) == (2, f"{PROG}: error: {message}\n")


@pytest.mark.slow
def test_an_unknown_split_is_refused_before_anything_is_read_or_created(dataset, tmp_path, capsys):
    code, out, err = _run_main(capsys, dataset, "--out", tmp_path / "o", "--split", "nosuch", "--split", "train")
    assert code == 2 and out == "" and not (tmp_path / "o").exists()
    assert err == (
        f"{PROG}: error: split 'nosuch' is not in {dataset}/dataset_info.json; "
        "expected one of ['train', 'validation']\n"
    )


@pytest.mark.slow
def test_more_examples_than_a_split_holds_is_capped_with_a_note(dataset, tmp_path, capsys):
    code, out, _ = _run_main(
        capsys, dataset, "--out", tmp_path / "o", "--num_examples", 100000, "--split", "validation"
    )
    size = tfr.num_examples(dataset, "validation")
    assert code == 0 and f"note: --num_examples 100000 is more than validation holds: its sheet shows all {size}" in out
    assert len(json.loads(Image.open(tmp_path / "o" / "contact_sheet-validation.png").text[TILES_CHUNK])) == size
    code, out, _ = _run_main(capsys, dataset, "--out", tmp_path / "p", "--scan", 5, "--split", "validation")
    assert code == 0  # --scan alone lowers the default --num_examples rather than contradicting it


@pytest.mark.slow
def test_a_truncated_shards_note_says_what_its_sheet_shows(dataset, tmp_path, capsys):
    """A damaged split's sheet holds only the examples that could be read: the note says how many
    it shows and how many the split holds, never "all" of the manifest's count."""
    damaged = tmp_path / "damaged"
    shutil.copytree(dataset, damaged)
    info = json.loads((damaged / "dataset_info.json").read_text())
    truncated = damaged / info["splits"]["validation"]["shards"][1]["file"]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    held = info["splits"]["validation"]["num_examples"]
    for out, asked in ((tmp_path / "asked", ["--num_examples", 100000]), (tmp_path / "default", [])):
        code, stdout, _ = _run_main(capsys, damaged, "--out", out, "--split", "validation", *asked)
        shown = len(json.loads(Image.open(out / "contact_sheet-validation.png").text[TILES_CHUNK]))
        assert code == 1 and 0 < shown < held, stdout
        notes = [line for line in stdout.splitlines() if line.startswith("note: ")]
        assert len(notes) == 1 and "shows all" not in notes[0], stdout
        assert f"its sheet shows {shown} of its {held} examples" in notes[0], notes
        assert f"only {shown} could be read" in notes[0], notes
        assert notes[0].startswith(
            "note: --num_examples 100000 is more than validation holds" if asked else "note: validation:"
        )


def test_tensorflow_errors_lose_their_internals():
    raw = (
        "{{function_node __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/replica:0/task:0/device:"
        "CPU:0}} truncated record at 28594' failed with Read less bytes than requested [Op:IteratorGetNext] name: "
    )
    assert tensorflow_reason(raw) == "truncated record at 28594"
    assert tensorflow_reason("corrupted record at 12") == "corrupted record at 12"


def test_a_truncated_shard_is_named_with_its_record_and_byte(tmp_path):
    path = str(tmp_path / "s.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(3):
            writer.write(b"x" * 1000)
    data = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(data[:2500])
    count, problems = _read_records(path, {})
    assert (count, problems) == (-1, ["unreadable from record 2 (byte 2032): truncated record"])


def test_finding_a_read_error_prints_no_deprecation_warning(tmp_path):
    path = tmp_path / "s.tfrecord"
    path.write_bytes(b"\x00" * 20)
    code = f"from tfdata_readers.sources.records import tensorflow_read_error as e; print(e({str(path)!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr[-2000:]
    assert "deprecated" not in result.stderr and "{{function_node" not in result.stdout


def test_an_empty_split_sheet_keeps_its_title(tmp_path):
    sheet, tiles = draw_contact_sheet([], title="validation: 0 examples", image_size=(48, 64))
    assert tiles == []
    long_title = "validation: 0 of 0 examples, seed 0, 64x48 JPEG (left: stored, right: training view)"
    cut, _ = draw_contact_sheet([], title=long_title, image_size=(48, 64))
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    # The start is kept (the split and its count); only the end gives way.
    assert _fit(draw, long_title, ImageFont.load_default(size=18), 200, keep_start=True).startswith("validation: 0")
    top = np.asarray(cut.convert("L"))[5:30, :40]
    assert (top < 128).any()  # The title's first letters are drawn at the left edge.


@pytest.mark.parametrize(
    "size, shown", [(0, "0.00"), (4_600, "0.0044"), (675_553, "0.64"), (3 * 2**20, "3.00"), (15 * 2**20, "15.0")]
)
def test_sizes_are_mib_with_two_significant_digits(size, shown):
    assert format_mib(size) == shown


def test_counts_read_in_the_singular_for_one():
    assert [plural(1, "class", "classes"), plural(2, "class", "classes"), plural(1, "split")] == [
        "1 class",
        "2 classes",
        "1 split",
    ]

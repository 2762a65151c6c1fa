"""The report's pictures and wording, drawn from their pure inputs: captions in any script,
labels with control characters, empty splits, many classes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageDraw

from tfdata_readers.inspection.class_chart import balance, balance_text, chart_layout, draw_class_counts
from tfdata_readers.inspection.gather import SampleExample
from tfdata_readers.inspection.sheet import draw_contact_sheet
from tfdata_readers.inspection.text import MISSING, caption_font, displayable

_BAR = (0x1F, 0x6F, 0xB2)


def _example(label: str, filename: str = "x.png") -> SampleExample:
    image = np.full((48, 64, 3), 200, np.uint8)
    return SampleExample(label_id=0, label=label, filename=filename, key="k", image=image)


def _caption_box(sheet: Image.Image, tiles: list[dict]) -> tuple[int, int, int, int]:
    left, _, right, bottom = tiles[0]["box"]
    return left, bottom + 2, right, bottom + 19


def _glyph(font, char: str) -> tuple:
    mask = font.getmask(char)
    return mask.size, bytes(mask)


@pytest.mark.parametrize("label", ["café", "猫", "Ж", "naïve Ωmega"])
def test_a_caption_in_any_script_draws_no_missing_glyph_boxes(label):
    font = caption_font(13)
    sheet, tiles = draw_contact_sheet([_example(label)], title="t", image_size=(48, 64))
    left, top, right, bottom = _caption_box(sheet, tiles)
    drawn = np.asarray(sheet.convert("L"))[top:bottom, left:right]
    # What drawing the label's characters as missing glyphs puts in the same place.
    blank, _ = draw_contact_sheet([_example("")], title="t", image_size=(48, 64))
    ImageDraw.Draw(blank).text((left, top + 1), MISSING * len(label), fill=(20, 20, 20), font=font)
    boxes = np.asarray(blank.convert("L"))[top:bottom, left:right]
    assert (drawn < 128).any() and not np.array_equal(drawn, boxes)
    shown = displayable(label, font)
    # Every character drawn is one the font has; what it lacks is spelled out, never boxed.
    assert all(c.isspace() or _glyph(font, c) != _glyph(font, MISSING) for c in shown), shown


def test_a_character_the_font_lacks_is_spelled_as_its_code_point():
    assert displayable("猫", caption_font(13)) in ("猫", "U+732B")
    assert displayable("café", caption_font(13)) in ("café", "cafe")  # the accent, else its base letter


@pytest.mark.parametrize("label", ["two\nlines", "tab\there", "bell\x07", "cr\r"])
def test_a_label_with_control_characters_is_drawn_on_one_line(label):
    sheet, tiles = draw_contact_sheet([_example(label, filename=label + ".png")], title=label, image_size=(48, 64))
    assert tiles[0]["label"] == label  # the PNG's tile list keeps the label as it is
    shown = displayable(label, caption_font(13))
    assert "\n" not in shown and "\r" not in shown and all(c.isprintable() for c in shown)
    draw_class_counts({"train": {label: 3, "b": 0}}, title=label)  # the chart draws it too


def test_an_empty_split_sheet_shows_its_whole_title():
    title = "validation: 0 examples"
    sheet, _ = draw_contact_sheet([], title=title, image_size=(48, 64))
    font = caption_font(18)
    needed = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(displayable(title, font), font=font)
    assert sheet.width >= needed + 20
    # The title as drawn is the whole title: the same pixels as the title alone on a wide canvas.
    wide = Image.new("RGB", (sheet.width + 400, 40), "white")
    ImageDraw.Draw(wide).text((10, 8), title, fill=(20, 20, 20), font=font)
    band = np.asarray(sheet.convert("L"))[:30]
    assert np.array_equal(band, np.asarray(wide.convert("L"))[:30, : sheet.width])


@pytest.mark.parametrize("num_classes", [1, 9, 150])
def test_the_charts_title_stays_above_every_panel(num_classes):
    counts = {
        "train": {f"class_{i:03d}": (i * 7) % 50 + 1 for i in range(num_classes)},
        "validation": {f"class_{i:03d}": i % 3 for i in range(num_classes)},
    }
    png = draw_class_counts(counts, title="examples per class (data)")
    chart = Image.open(io.BytesIO(png)).convert("RGB")
    layout = chart_layout(2, num_classes)
    assert chart.size == (layout.width, layout.height)
    pixels = np.asarray(chart)
    _, _, _, title_bottom = layout.title_box
    assert all(top >= title_bottom for _, top, _, _ in layout.panels)
    assert (pixels[:title_bottom].min(axis=2) < 100).any()  # the title is drawn in its band
    bar = np.all(pixels == _BAR, axis=2)
    assert not bar[:title_bottom].any()  # and no bar reaches into it
    assert bar[title_bottom:].any()  # the bars are drawn, below it


def test_a_split_without_examples_reads_no_examples_never_none():
    summary = balance({"a": 0, "b": 0})
    assert balance_text(summary) == "no examples"
    assert balance_text(balance({"a": 10, "b": 2, "c": 0})) == "largest/smallest 5.0 (a/b)"


@pytest.mark.parametrize(
    ("counts", "text"),
    [
        ({"class_00": 7}, "one class (class_00)"),
        ({"class_00": 7, "empty": 0}, "one class with examples (class_00)"),
        ({"a": 4, "b": 4, "c": 4}, "balanced (every class the same size)"),
        ({"a": 4, "b": 5}, "largest/smallest 1.2 (b/a)"),
    ],
)
def test_one_class_or_a_balanced_split_is_said_in_words_not_as_a_ratio_of_one(counts, text):
    assert balance_text(balance(counts)) == text


def test_the_html_report_words_an_empty_split_as_no_examples():
    from tfdata_readers.inspection import html_report

    assert "None" not in html_report.balance_footer("validation", {"a": 0, "b": 0})
    assert html_report.balance_footer("validation", {"a": 0, "b": 0}) == "validation: no examples, empty: a, b"

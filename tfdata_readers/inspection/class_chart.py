"""The class histogram per split, sorted, with its imbalance ratio and empty classes flagged.

Drawn with Pillow, a core dependency, so that the report works after a plain `pip install .`
(it needed matplotlib, and died after the contact sheets without it). The geometry is a pure
function (`chart_layout`): the title has a band of its own above the panels, whatever the number
of classes, and the picture's size is known before anything is drawn.
"""

from __future__ import annotations

import dataclasses
import io

from PIL import Image, ImageDraw, ImageFont

from tfdata_readers.inspection.text import caption_font, displayable

__all__ = ["Balance", "ChartLayout", "balance", "balance_text", "chart_layout", "chart_size", "draw_class_counts"]

BAR_COLOUR = (0x1F, 0x6F, 0xB2)
EMPTY_COLOUR = (0xC6, 0x28, 0x28)
_INK = (0x22, 0x22, 0x22)
_AXIS = (0x99, 0x99, 0x99)
_MARGIN = 20
_TITLE_H = 40  # the chart's title band, above every panel
_HEADER_H = 44  # a panel's two header lines: "split: N examples" and its balance
_ROW_H = 20  # one bar
_FOOT_H = 30  # the x axis and its label
_PANEL_W = 520
_LABEL_W = 180  # class names, right-aligned against the bars
_COUNT_W = 56  # room right of the longest bar for its count


@dataclasses.dataclass(frozen=True)
class Balance:
    """`ratio` is largest / smallest non-empty class (None when no class has an example);
    `empty` the classes with none, which a ratio would hide."""

    ratio: float | None
    largest: str | None
    smallest: str | None
    empty: tuple[str, ...]
    with_examples: int = 0  # how many classes have an example: one makes no ratio worth saying


def balance(counts: dict[str, int]) -> Balance:
    """Pure: the imbalance of one split's {class: examples}."""
    present = {name: n for name, n in counts.items() if n > 0}
    empty = tuple(sorted(name for name, n in counts.items() if n <= 0))
    if not present:
        return Balance(None, None, None, empty)
    largest = max(sorted(present), key=lambda name: present[name])
    smallest = min(sorted(present), key=lambda name: present[name])
    return Balance(present[largest] / present[smallest], largest, smallest, empty, len(present))


def balance_text(summary: Balance) -> str:
    """The one wording of a split's balance for the terminal, the page and the chart: "no
    examples" when the split has none, never a ratio of None."""
    if summary.ratio is None:
        return "no examples"
    # A ratio of one class to itself, or of equals, says nothing a word does not say better.
    if summary.with_examples == 1:
        return f"one class{' with examples' if summary.empty else ''} ({summary.largest})"
    if summary.ratio == 1.0:
        return "balanced (every class the same size)"
    return f"largest/smallest {summary.ratio:.1f} ({summary.largest}/{summary.smallest})"


@dataclasses.dataclass(frozen=True)
class ChartLayout:
    """Pixel geometry: `title_box` and each split's panel as (left, top, right, bottom)."""

    width: int
    height: int
    title_box: tuple[int, int, int, int]
    panels: tuple[tuple[int, int, int, int], ...]


def chart_layout(num_splits: int, num_classes: int) -> ChartLayout:
    """Pure: one panel per split side by side, a bar per class, the title in a band above them."""
    splits, classes = max(1, num_splits), max(1, num_classes)
    width = _MARGIN + splits * (_PANEL_W + _MARGIN)
    height = _TITLE_H + _HEADER_H + classes * _ROW_H + _FOOT_H + _MARGIN
    panels = tuple(
        (_MARGIN + i * (_PANEL_W + _MARGIN), _TITLE_H, _MARGIN + i * (_PANEL_W + _MARGIN) + _PANEL_W, height - _MARGIN)
        for i in range(splits)
    )
    return ChartLayout(width=width, height=height, title_box=(0, 0, width, _TITLE_H), panels=panels)


def chart_size(num_splits: int, num_classes: int) -> tuple[int, int]:
    """(width, height) in pixels of the chart."""
    layout = chart_layout(num_splits, num_classes)
    return layout.width, layout.height


def _fit(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont | ImageFont.FreeTypeFont, width: int) -> str:
    """One drawable line, shortened at its end with an ellipsis until it fits `width`."""
    text = displayable(text, font)
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def _panel(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], split: str, counts: dict[str, int]) -> None:
    left, top, right, bottom = box
    header, small = caption_font(14), caption_font(12)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    total = sum(n for _, n in ordered)
    summary = balance(counts)
    flag = f", {len(summary.empty)} empty" if summary.empty else ""
    draw.text((left, top + 2), _fit(draw, f"{split}: {total} examples", header, _PANEL_W), fill=_INK, font=header)
    draw.text((left, top + 22), _fit(draw, balance_text(summary) + flag, small, _PANEL_W), fill=_INK, font=small)
    bars_left, bars_right = left + _LABEL_W, right - _COUNT_W
    peak = max((n for _, n in ordered), default=0)
    y = top + _HEADER_H
    for name, n in ordered:
        label = _fit(draw, name, small, _LABEL_W - 8)
        draw.text((bars_left - 6 - draw.textlength(label, font=small), y + 3), label, fill=_INK, font=small)
        if n > 0:
            length = max(1, round((bars_right - bars_left) * n / max(1, peak)))
            draw.rectangle((bars_left, y + 3, bars_left + length, y + _ROW_H - 3), fill=BAR_COLOUR)
            draw.text((bars_left + length + 4, y + 3), str(n), fill=_INK, font=small)
        else:
            draw.text((bars_left + 4, y + 3), "EMPTY", fill=EMPTY_COLOUR, font=small)
        y += _ROW_H
    axis_y = top + _HEADER_H + max(1, len(ordered)) * _ROW_H + 2
    draw.line((bars_left, top + _HEADER_H, bars_left, axis_y), fill=_AXIS)
    draw.line((bars_left, axis_y, bars_right, axis_y), fill=_AXIS)
    draw.text((bars_left, axis_y + 4), f"0 … {peak} examples", fill=_INK, font=small)


def draw_class_counts(counts_by_split: dict[str, dict[str, int]], *, title: str = "") -> bytes:
    """PNG bytes: per split, horizontal bars from the largest class down; empty classes in red."""
    splits = list(counts_by_split)
    num_classes = max((len(c) for c in counts_by_split.values()), default=1)
    layout = chart_layout(len(splits), num_classes)
    chart = Image.new("RGB", (layout.width, layout.height), "white")
    draw = ImageDraw.Draw(chart)
    if title:
        font = caption_font(16)
        draw.text((_MARGIN, 10), _fit(draw, title, font, layout.width - 2 * _MARGIN), fill=_INK, font=font)
    for box, split in zip(layout.panels, splits, strict=True):
        _panel(draw, box, split, counts_by_split[split])
    buffer = io.BytesIO()
    chart.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()

"""The contact sheet: a grid of sampled examples, each captioned with its class and file name.

Drawn with Pillow. The layout is a pure function of the sample size and options, so its pixel
size and tile boxes are known (and tested) before anything is drawn; the PNG also records, in a
text chunk, which tile shows which example, for tools and tests that read the picture back.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

from tfdata_readers.inspection.gather import SampleExample
from tfdata_readers.inspection.text import caption_font, displayable

__all__ = ["SheetLayout", "TILES_CHUNK", "draw_contact_sheet", "sheet_jpeg", "sheet_layout", "sheet_png"]

TILES_CHUNK = "tiles"  # PNG text chunk: JSON list of {"box", "label", "filename"}
_BACKGROUND = (255, 255, 255)
_CAPTION = (20, 20, 20)
_FAINT = (110, 110, 110)
_TITLE_H = 40
_CAPTION_H = 38
_GAP = 10
_MAX_TITLE_WIDTH = 1600


@dataclasses.dataclass(frozen=True)
class SheetLayout:
    """Pixel geometry of a sheet: `tiles[i]` is the (left, top, right, bottom) of example i's
    picture area (two pictures side by side with `augmented`); its caption is below it."""

    width: int
    height: int
    columns: int
    rows: int
    picture: tuple[int, int]  # (width, height) of one picture inside a tile
    tiles: tuple[tuple[int, int, int, int], ...]


def sheet_layout(
    count: int,
    *,
    image_size: tuple[int, int],
    tile: int = 160,
    augmented: bool = False,
    columns: int | None = None,
    min_width: int = 0,
) -> SheetLayout:
    """Where each of `count` tiles goes. `image_size` is (height, width) of the examples; each
    picture is scaled to fit a `tile` x `tile` box keeping its aspect ratio (never enlarged more
    than 4x, so that tiny images stay tiny and honest). The sheet is at least `min_width` wide,
    so that a short sample (or none) still shows its whole title."""
    if count < 0 or tile < 32:
        raise ValueError(f"count must be >= 0 and tile >= 32 (got count={count!r}, tile={tile!r})")
    height, width = image_size
    scale = min(tile / width, tile / height, 4.0)
    picture = (max(1, round(width * scale)), max(1, round(height * scale)))
    per_tile = 2 if augmented else 1
    tile_w = picture[0] * per_tile + (_GAP // 2) * (per_tile - 1)
    columns = columns or max(1, min(count, (8 if not augmented else 4)))
    rows = max(1, math.ceil(count / columns))
    cell_w, cell_h = tile_w + _GAP, picture[1] + _CAPTION_H + _GAP
    tiles = []
    for i in range(count):
        row, column = divmod(i, columns)
        left, top = _GAP + column * cell_w, _TITLE_H + row * cell_h
        tiles.append((left, top, left + tile_w, top + picture[1]))
    return SheetLayout(
        width=max(_GAP + columns * cell_w, min_width),
        height=_TITLE_H + rows * cell_h,
        columns=columns,
        rows=rows,
        picture=picture,
        tiles=tuple(tiles),
    )


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return caption_font(size)


def _text_width(text: str, font: ImageFont.ImageFont | ImageFont.FreeTypeFont) -> int:
    """Pixels that `text` takes on one line, as `_fit` would draw it."""
    return math.ceil(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(displayable(text, font), font=font))


def _fit(
    draw: ImageDraw.ImageDraw,
    text: str,
    font: ImageFont.ImageFont | ImageFont.FreeTypeFont,
    width: int,
    *,
    keep_start: bool = False,
) -> str:
    """`text`, shortened with an ellipsis until it fits: from the left by default, since the end of
    a path (the file name) is the part worth keeping; from the right with `keep_start`, for a
    title, whose start (the split and its count) is. Control characters and glyphs the font
    lacks are spelled out first (`displayable`): a newline in a label is drawn as \\n."""
    text = displayable(text, font)
    if draw.textlength(text, font=font) <= width:
        return text
    if keep_start:
        while text and draw.textlength(text + "…", font=font) > width:
            text = text[:-1]
        return text + "…"
    while text and draw.textlength("…" + text, font=font) > width:
        text = text[1:]
    return "…" + text


def _picture(pixels: np.ndarray, size: tuple[int, int]) -> Image.Image:
    image = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    return image.convert("RGB").resize(size, Image.Resampling.LANCZOS)


def draw_contact_sheet(
    examples: list[SampleExample] | tuple[SampleExample, ...],
    *,
    title: str,
    image_size: tuple[int, int],
    tile: int = 160,
    augmented: bool = False,
    note: str | None = None,
) -> tuple[Image.Image, list[dict]]:
    """The sheet, and per tile {"box", "label", "filename"} in drawing order.

    With `augmented` each tile shows the stored image and, to its right, its training view.
    `note` (why the sample is short or empty) is printed under the title.
    """
    title_font, label_font, name_font = _font(18), _font(13), _font(11)
    # Wide enough for the whole title and note (capped: a title is not a reason for a 10,000 px sheet).
    wanted = max(_text_width(title, title_font), _text_width(note or "", name_font)) + 2 * _GAP
    layout = sheet_layout(
        len(examples), image_size=image_size, tile=tile, augmented=augmented, min_width=min(wanted, _MAX_TITLE_WIDTH)
    )
    sheet = Image.new("RGB", (layout.width, layout.height), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text(
        (_GAP, 8),
        _fit(draw, title, title_font, layout.width - 2 * _GAP, keep_start=True),
        fill=_CAPTION,
        font=title_font,
    )
    if note:
        draw.text((_GAP, 27), _fit(draw, note, name_font, layout.width - 2 * _GAP), fill=(180, 0, 0), font=name_font)
    tiles = []
    for example, box in zip(examples, layout.tiles, strict=True):
        left, top, right, bottom = box
        sheet.paste(_annotated(_picture(example.image, layout.picture), example.boxes, example.mask), (left, top))
        if augmented and example.augmented is not None:
            view = _annotated(
                _picture(example.augmented, layout.picture), example.augmented_boxes, example.augmented_mask
            )
            sheet.paste(view, (right - layout.picture[0], top))
        width = right - left
        draw.text(
            (left, bottom + 3),
            _fit(draw, f"{example.label} ({example.label_id})", label_font, width),
            fill=_CAPTION,
            font=label_font,
        )
        draw.text((left, bottom + 20), _fit(draw, example.filename, name_font, width), fill=_FAINT, font=name_font)
        tile_entry = {"box": list(box), "label": example.label, "filename": example.filename}
        if example.boxes:
            tile_entry["objects"] = [list(b) for b in example.boxes]
        tiles.append(tile_entry)
    return sheet, tiles


def sheet_png(sheet: Image.Image, tiles: list[dict]) -> bytes:
    """The sheet as PNG bytes, with the tile list in its `tiles` text chunk."""
    meta = PngInfo()
    meta.add_text(TILES_CHUNK, json.dumps(tiles, ensure_ascii=False))
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG", pnginfo=meta, optimize=True)
    return buffer.getvalue()


def sheet_jpeg(sheet: Image.Image, quality: int = 85) -> bytes:
    """The sheet as JPEG bytes, for embedding in report.html: photos take a fifth of the PNG's
    bytes, and the page stays quick to open and mail."""
    buffer = io.BytesIO()
    sheet.save(buffer, format="JPEG", quality=quality, optimize=True)
    return buffer.getvalue()


# Colours of class ids (cycled), for mask overlays and boxes: distinct at a glance.
_PALETTE = ((230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240))


def _colour(index: int) -> tuple[int, int, int]:
    return _PALETTE[index % len(_PALETTE)]


def _annotated(
    picture: Image.Image, boxes: tuple[tuple[str, float, float, float, float], ...], mask: np.ndarray | None
) -> Image.Image:
    """The picture with its mask's classes tinted (padding, id 255, left as it is) and its boxes
    drawn, each with its class name: what a detection or segmentation model is taught."""
    if mask is not None:
        mask = np.asarray(Image.fromarray(mask).resize(picture.size, Image.Resampling.NEAREST))
        tint = np.asarray(picture, np.float32).copy()
        for class_id in (int(v) for v in np.unique(mask) if 0 < v < 255):
            where = mask == class_id
            tint[where] = 0.55 * tint[where] + 0.45 * np.array(_colour(class_id), np.float32)
        picture = Image.fromarray(tint.astype(np.uint8))
    if boxes:
        draw = ImageDraw.Draw(picture)
        font = _font(11)
        width, height = picture.size
        names = sorted({name for name, *_ in boxes})
        for name, ymin, xmin, ymax, xmax in boxes:
            colour = _colour(names.index(name))
            corners = (
                xmin * width,
                ymin * height,
                max(xmin * width, xmax * width - 1),
                max(ymin * height, ymax * height - 1),
            )
            draw.rectangle(corners, outline=colour, width=2)
            draw.text((corners[0] + 2, corners[1] + 1), displayable(name, font), fill=colour, font=font)
    return picture

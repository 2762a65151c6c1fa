"""Text on the report's pictures: a font that covers most scripts, and captions made drawable.

Pillow's built-in font covers ASCII only: "café" or "Ж" came out as boxes. DejaVu Sans (shipped
by most Linux distributions) covers Latin, Greek and Cyrillic; Pillow finds
it by name in the system's font folders. A character the chosen font still lacks (CJK, on most
machines) is spelled as its code point, "U+732B", rather than drawn as a box that every missing
character shares; the tile list in the PNG and report.html keep the text as it is.
"""

from __future__ import annotations

import functools
import unicodedata

from PIL import ImageFont

__all__ = ["MISSING", "caption_font", "displayable"]

# A code point no font maps (the last of plane 16, a noncharacter): what a missing glyph looks like.
MISSING = "\U0010ffff"
_FONT_NAMES = ("DejaVuSans.ttf", "NotoSans-Regular.ttf", "LiberationSans-Regular.ttf", "Arial.ttf")

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


@functools.cache
def caption_font(size: int) -> Font:
    """The first of the well-known wide-coverage fonts this machine has, else Pillow's own."""
    for name in _FONT_NAMES:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


def _glyph(font: Font, char: str) -> tuple:
    mask = font.getmask(char)
    return mask.size, bytes(mask)


@functools.lru_cache(maxsize=4096)
def _has_glyph(font: Font, char: str) -> bool:
    return char.isspace() or _glyph(font, char) != _glyph(font, MISSING)


def _spell(char: str, font: Font) -> str:
    """A drawable stand-in: a control character as its escape (a newline as \\n), an accented
    letter as its base letter, anything else as its code point."""
    if unicodedata.category(char).startswith("C"):
        return char.encode("unicode_escape").decode("ascii")
    base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
    if base and base != char and all(_has_glyph(font, c) for c in base):
        return base
    return f"U+{ord(char):04X}"


def displayable(text: str, font: Font) -> str:
    """`text` as one line that `font` can draw: nothing multi-line (Pillow refuses to measure
    it), nothing drawn as a missing-glyph box."""
    return "".join(
        char if not unicodedata.category(char).startswith("C") and _has_glyph(font, char) else _spell(char, font)
        for char in text
    )

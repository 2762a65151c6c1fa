"""Test data built in one place: real photographs (from the sample tree) and broken files."""

from __future__ import annotations

import io
import pathlib

import numpy as np
from PIL import Image

from beam_jobs.sample_data import make_photo_tree, source_photo_paths

__all__ = [
    "BROKEN_FILES",
    "encode",
    "make_test_tree",
    "real_photo",
    "write_broken_files",
]


def real_photo(name: str = "chelsea", size: tuple[int, int] | None = None) -> Image.Image:
    """One of the shipped real photographs, as RGB, optionally resized to (width, height)."""
    image = Image.open(source_photo_paths()[name]).convert("RGB")
    return image.resize(size, Image.Resampling.BICUBIC) if size else image


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _truncated_jpeg() -> bytes:
    data = encode(real_photo("coffee"), "JPEG", quality=90)
    return data[: len(data) // 2]


def _truncated_png() -> bytes:
    data = encode(real_photo("rocket"), "PNG")
    return data[: len(data) // 3]


def _png_header_bomb() -> bytes:
    # A valid PNG signature and IHDR claiming 40000x40000 pixels, with no image data behind it.
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        body = kind + payload
        return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", 40000, 40000, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# name -> (bytes factory, expected dead-letter reason)
BROKEN_FILES = {
    "empty.jpg": (lambda: b"", "empty_file"),
    "error_page.jpg": (lambda: b"<!DOCTYPE html><html><body>403 Forbidden</body></html>", "not_an_image"),
    "random_bytes.png": (
        lambda: np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "not_an_image",
    ),
    "truncated.jpg": (_truncated_jpeg, "truncated"),
    "truncated.png": (_truncated_png, "truncated"),
    "bomb.png": (_png_header_bomb, "too_many_pixels"),
    "photoshop.jpg": (lambda: b"8BPS\x00\x01" + b"\x00" * 20 + b"\x00" * 64, "format_not_allowed"),
}


def write_broken_files(folder: pathlib.Path) -> dict[str, str]:
    """Writes every BROKEN_FILES entry into ``folder``; returns {path: expected reason}."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {}
    for name, (factory, reason) in BROKEN_FILES.items():
        path = folder / name
        path.write_bytes(factory())
        expected[str(path)] = reason
    return expected


def make_test_tree(
    root: pathlib.Path, *, num_images: int = 36, broken: bool = True
) -> tuple[list[pathlib.Path], dict[str, str]]:
    """A class-per-folder tree of real photos (500x375 JPEGs), plus broken files in one class folder,
    plus files that must be ignored. Returns (good paths, {broken path: expected reason})."""
    good = make_photo_tree(root, num_images=num_images, size=(500, 375), seed=1)
    (root / "notes.txt").write_text("not an image")
    (root / "chelsea" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    broken_files = write_broken_files(root / "chelsea") if broken else {}
    return good, broken_files


# --- Hostile inputs for the reliability suite -------------------------------------------------


def _eps() -> bytes:
    return b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nnewpath 0 0 moveto showpage\n%%EOF\n"


def _fits() -> bytes:
    cards = [
        "SIMPLE  =                    T",
        "BITPIX  =                    8",
        "NAXIS   =                    2",
        "NAXIS1  =                   10",
        "NAXIS2  =                   10",
        "END",
    ]
    header = b"".join(card.ljust(80).encode("ascii") for card in cards).ljust(2880, b" ")
    return header + bytes(100).ljust(2880, b"\x00")


def _psd() -> bytes:
    # Signature, version 1, reserved, 3 channels, 10x10, depth 8, RGB, then empty sections.
    import struct

    return b"8BPS" + struct.pack(">H6sHIIHH", 1, b"\x00" * 6, 3, 10, 10, 8, 3) + b"\x00" * 12 + b"\x00" * 300


def _broken_exif_jpeg() -> bytes:
    data = encode(real_photo("chelsea", (64, 48)), "JPEG")
    # An APP1 "Exif" segment whose TIFF header points past its end.
    return data[:2] + b"\xff\xe1\x00\x10Exif\x00\x00MM\x00\x2a\xff\xff\xff\xff" + data[2:]


def _animated_gif() -> bytes:
    frames = [real_photo("rocket", (60, 40)), real_photo("coffee", (60, 40))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buffer.getvalue()


def _multipage_tiff() -> bytes:
    pages = [real_photo("flower", (60, 40)), real_photo("china", (60, 40))]
    buffer = io.BytesIO()
    pages[0].save(buffer, "TIFF", save_all=True, append_images=pages[1:])
    return buffer.getvalue()


def _truncations(fmt: str, name: str) -> dict:
    data = encode(real_photo(name), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    cuts = {"head": 40, "quarter": len(data) // 4, "half": len(data) // 2, "tail": len(data) - 200}
    return {
        f"truncated_{cut}.{fmt.lower()}": (lambda n=n: data[:n], "truncated_or_undecodable") for cut, n in cuts.items()
    }


HOSTILE_FILES = {
    "empty.jpg": (lambda: b"", "empty_file"),
    "random.jpg": (lambda: np.random.default_rng(7).integers(0, 256, 10000, dtype=np.uint8).tobytes(), "not_an_image"),
    "html_error.jpg": (
        lambda: b"<html><head><title>404 Not Found</title></head><body>nope</body></html>",
        "not_an_image",
    ),
    "json_error.png": (lambda: b'{"error": {"code": 403, "message": "Access denied."}}', "not_an_image"),
    "bomb.png": (_png_header_bomb, "too_many_pixels"),
    "postscript.jpg": (_eps, "format_not_allowed"),
    "photoshop.jpg": (_psd, "format_not_allowed"),
    "telescope.jpg": (_fits, "format_not_allowed"),
    **_truncations("JPEG", "coffee"),
    **_truncations("PNG", "rocket"),
}

# Odd but valid files: each must become a normal example.
ODD_VALID_FILES = {
    "broken_exif.jpg": _broken_exif_jpeg,
    "animated.gif": _animated_gif,
    "multipage.tif": _multipage_tiff,
}

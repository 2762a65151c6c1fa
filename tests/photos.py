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
    "random_bytes.png": (lambda: np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
                         "not_an_image"),
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


def make_test_tree(root: pathlib.Path, *, num_images: int = 36, broken: bool = True) -> tuple[list[pathlib.Path], dict[str, str]]:
    """A class-per-folder tree of real photos (500x375 JPEGs), plus broken files in one class folder,
    plus files that must be ignored. Returns (good paths, {broken path: expected reason})."""
    good = make_photo_tree(root, num_images=num_images, size=(500, 375), seed=1)
    (root / "notes.txt").write_text("not an image")
    (root / "chelsea" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    broken_files = write_broken_files(root / "chelsea") if broken else {}
    return good, broken_files

"""The command's name, in a module that imports nothing: the SIGTERM line needs it before the
flags (and the NumPy and Pillow they import) are loaded."""

from __future__ import annotations

__all__ = ["PROG"]

PROG = "images-to-tfrecords"

"""CLI: `python -m tfdata_readers.verify DATA_DIR [--split S] [--version N]`; exits 1 if the dataset
disagrees with its manifest (the command lives in checking/verify_cli.py)."""

from __future__ import annotations

import sys

from tfdata_readers.checking.verify_cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

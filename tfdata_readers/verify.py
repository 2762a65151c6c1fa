"""CLI: `python -m tfdata_readers.verify DATA_DIR [--split S] [--version N]`; exits 1 if the dataset disagrees with its manifest."""

from __future__ import annotations

import sys

from tfdata_readers.verification import main

if __name__ == "__main__":
    sys.exit(main())

"""How the report writes sizes and counts: MiB with two significant digits at least, and plurals."""

from __future__ import annotations

import math

__all__ = ["format_mib", "plural"]


def format_mib(size: int) -> str:
    """Bytes in MiB (2**20), the unit the report names: a 4.6 KB shard reads 0.0044, not 0.00."""
    mib = size / 2**20
    if mib >= 10:
        return f"{mib:.1f}"
    if mib >= 0.01 or size == 0:
        return f"{mib:.2f}"
    return f"{mib:.{1 - math.floor(math.log10(mib))}f}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 class', '2 classes'."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"

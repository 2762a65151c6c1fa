"""A decoder whose module cannot be imported in a child process: a worker whose native codec
library is missing. The test process itself imports it fine (it must, to send the function)."""

from __future__ import annotations

import multiprocessing

if multiprocessing.parent_process() is not None:
    raise ImportError("libexamplecodec.so.1: cannot open shared object file (a missing native codec)")


def square(x: int) -> int:
    return x * x

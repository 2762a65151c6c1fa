"""A decoder that hangs or crashes costs one dead letter, never a worker."""

from __future__ import annotations

import os
import time

import pytest

from beam_jobs.errors import BadInputError
from beam_jobs.isolation import IsolatedRunner, needs_isolation
from tests.photos import encode, real_photo


def _hang(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


def _crash() -> None:
    os.abort()  # What a segfaulting C decoder looks like from outside: the process dies.


def _square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_a_hanging_decoder_is_killed_and_the_next_call_works():
    runner = IsolatedRunner(timeout_s=2)
    try:
        assert runner(_square, 7) == 49
        start = time.monotonic()
        with pytest.raises(BadInputError) as caught:
            runner(_hang, 600)
        assert caught.value.reason == "decoder_timeout"
        assert time.monotonic() - start < 30
        assert runner(_square, 8) == 64
    finally:
        runner.close()


@pytest.mark.slow
def test_a_crashing_decoder_is_contained_and_the_next_call_works():
    runner = IsolatedRunner(timeout_s=60)
    try:
        with pytest.raises(BadInputError) as caught:
            runner(_crash)
        assert caught.value.reason == "decoder_crashed"
        assert runner(_square, 3) == 9
    finally:
        runner.close()


@pytest.mark.parametrize(
    "fmt, policy, expected",
    [("JPEG", "risky", False), ("PNG", "risky", False), ("TIFF", "risky", True), ("GIF", "risky", True),
     ("WEBP", "risky", True), ("BMP", "risky", True), ("JPEG", "all", True), ("TIFF", "none", False)],
)
def test_only_risky_formats_leave_the_fast_path_by_default(fmt, policy, expected):
    assert needs_isolation(encode(real_photo("chelsea", (16, 16)), fmt), policy) is expected

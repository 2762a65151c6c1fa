"""A decoder that hangs or crashes costs one dead letter, never a worker."""

from __future__ import annotations

import os
import time

import pytest

from beam_jobs.config import ImageConfig
from beam_jobs.convert import ConvertShardFn
from beam_jobs.errors import BadInputError, WorkerShutdownError
from beam_jobs.isolation import IsolatedRunner, needs_isolation
from beam_jobs.plan import plan_dataset
from beam_jobs.records import InputFile
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


def test_a_closed_runner_refuses_work_instead_of_blaming_the_file():
    runner = IsolatedRunner(timeout_s=30)
    runner.close()
    with pytest.raises(WorkerShutdownError):
        runner(_square, 3)


@pytest.mark.slow
def test_a_shard_converted_while_its_worker_shuts_down_is_never_staged(tmp_path):
    """A runner that dies leaves workers tearing down under a shard: its images must not become
    dead letters of a shard that is then staged and trusted by --resume."""
    photos = [tmp_path / f"cat/{i}.jpg" for i in range(3)]
    photos[0].parent.mkdir()
    for path in photos:
        path.write_bytes(encode(real_photo("chelsea", (64, 48)), "JPEG"))
    inputs = [InputFile(f"cat/{p.name}", str(p), label="cat") for p in photos]
    shard = plan_dataset(inputs, num_shards=1, example_bytes=1).shards[0]
    out = tmp_path / "out"
    out.mkdir()
    fn = ConvertShardFn(ImageConfig(width=32, height=32, isolation="all"), str(out))
    fn.setup()
    fn._isolated.close()  # What teardown does while process() still runs on another thread.
    with pytest.raises(WorkerShutdownError):
        list(fn.process(shard))
    fn.teardown()
    with pytest.raises(WorkerShutdownError):
        list(fn.process(shard))
    assert sorted(os.listdir(out)) == []

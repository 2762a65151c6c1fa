"""A decoder that hangs or crashes costs one dead letter, never a worker; a child process that is
slow to start, or cannot start, is never blamed on a file.

Slow start-ups are made real, and certain, with a gate the test opens (startup_gate.py), so no
verdict here depends on how fast this machine spawns Python."""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import pathlib
import signal
import time

import pytest

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError, WorkerShutdownError
from beam_jobs.imaging.isolation import DecoderStartupError, IsolatedRunner, needs_isolation
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import InputFile, ShardResult
from beam_jobs.writing.convert_shards import ConvertShardFn
from tests.photos import encode, real_photo
from tests.reliability.startup_gate import StartupGate

# Long enough for a small call's round trip to the child on a loaded machine (start-up is not
# charged to it), short enough that a test of a hang stays quick.
_DECODE_TIMEOUT_S = 5


def _hang(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


def _crash() -> None:
    os.abort()  # What a segfaulting C decoder looks like from outside: the process dies.


def _square(x: int) -> int:
    return x * x


def _assert_still_waiting(call: concurrent.futures.Future, seconds: float) -> None:
    """The call has not finished (nor failed) within ``seconds``, while its child is held."""
    done, _ = concurrent.futures.wait([call], timeout=seconds)
    if done:
        raise AssertionError(f"the call ended while its child was still starting: {call.exception()!r}")


def _result_once_the_held_start_up_ends(gate: StartupGate, work, *, besides: frozenset[int] = frozenset()):
    """Runs ``work()`` on another thread while ``gate`` holds a fresh child's start-up: the work must
    still be waiting after twice the decode timeout (start-up is not charged to it), and it must
    finish once the gate opens. Returns its result."""
    with concurrent.futures.ThreadPoolExecutor(1) as caller:
        call = caller.submit(work)
        gate.wait_for_arrival(besides=besides)
        _assert_still_waiting(call, 2 * _DECODE_TIMEOUT_S)  # Start-up now outlasts the timeout.
        gate.open()
        return call.result(timeout=600)


def _is_gone(pid: int, *, reaped: bool) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return not reaped and state in ("Z", "X")  # Dead, and only waiting to be reaped.


def _wait_until_gone(pid: int, *, reaped: bool = False, deadline_s: float = 120) -> None:
    give_up = time.monotonic() + deadline_s
    while not _is_gone(pid, reaped=reaped):
        if time.monotonic() > give_up:
            raise AssertionError(f"child process {pid} is still running {deadline_s} s after it was given up")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_hanging_decoder_is_killed_and_the_next_call_works():
    """The first call starts the child, which can take longer than the timeout on a cold machine:
    only the call itself is timed."""
    runner = IsolatedRunner(timeout_s=_DECODE_TIMEOUT_S)
    try:
        assert runner(_square, 7) == 49
        hung_child = runner(os.getpid)
        with pytest.raises(BadInputError) as caught:
            runner(_hang, 600)
        assert caught.value.reason == "decoder_timeout"
        _wait_until_gone(hung_child)  # Killed, not left to run (or to finish) in the background.
        assert runner(_square, 8) == 64
        assert runner(os.getpid) != hung_child
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.parametrize("held_at", ["interpreter start", "decoder module import"])
def test_a_slow_child_start_up_is_not_charged_to_the_first_decode(tmp_path, monkeypatch, held_at):
    """On a cold or busy worker, starting Python and importing the decoder's modules can take
    longer than the decode timeout: the first risky file of a shard must not pay for it."""
    gate = StartupGate(tmp_path / "gate", monkeypatch)
    if held_at == "interpreter start":
        gate.hold_interpreter_start()
        function = _square
    else:  # Imported here, not at the top: every child imports this module for _square and _hang.
        function = importlib.import_module("tests.reliability.gated_decoder").square
    runner = IsolatedRunner(timeout_s=_DECODE_TIMEOUT_S)
    try:
        assert _result_once_the_held_start_up_ends(gate, lambda: runner(function, 7)) == 49
    finally:
        runner.close()


@pytest.mark.slow
def test_the_replacement_of_a_killed_child_starts_before_its_clock_does(tmp_path, monkeypatch):
    gate = StartupGate(tmp_path / "gate", monkeypatch)
    gate.hold_interpreter_start()
    gate.open()
    runner = IsolatedRunner(timeout_s=_DECODE_TIMEOUT_S)
    try:
        assert runner(_square, 2) == 4
        first_children = frozenset(gate.arrivals())
        gate.close()
        with pytest.raises(BadInputError) as caught:
            runner(_hang, 600)
        assert caught.value.reason == "decoder_timeout"
        assert _result_once_the_held_start_up_ends(gate, lambda: runner(_square, 5), besides=first_children) == 25
    finally:
        runner.close()


@pytest.mark.slow
def test_a_child_that_never_becomes_ready_is_a_start_up_error_not_a_dead_letter(tmp_path, monkeypatch):
    gate = StartupGate(tmp_path / "gate", monkeypatch)
    gate.hold_interpreter_start()
    runner = IsolatedRunner(timeout_s=1, startup_timeout_s=3)
    try:
        with pytest.raises(DecoderStartupError, match=r"not ready after 3 s") as caught:
            runner(_square, 7)
        assert not isinstance(caught.value, BadInputError)  # No image is to blame.
        assert isinstance(caught.value, WorkerShutdownError)  # So the shard fails and is retried.
        _wait_until_gone(gate.wait_for_arrival())  # Killed, not left waiting.
        # That the runner then starts a fresh child is checked with a generous start-up limit in
        # the next test: a real start-up here could itself outlast these 3 s on a busy machine.
    finally:
        gate.open()
        runner.close()


@pytest.mark.slow
def test_a_child_that_cannot_import_its_decoder_is_a_start_up_error_naming_the_module():
    runner = IsolatedRunner(timeout_s=30)
    try:
        with pytest.raises(DecoderStartupError, match=r"tests\.reliability\.unimportable_decoder.*libexamplecodec"):
            runner(importlib.import_module("tests.reliability.unimportable_decoder").square, 7)
        assert runner(_square, 3) == 9
    finally:
        runner.close()


@pytest.mark.slow
def test_a_child_that_died_while_idle_is_replaced_without_blaming_the_next_file():
    """An idle child killed from outside (the kernel's out-of-memory killer, say) is no file's fault."""
    runner = IsolatedRunner(timeout_s=60)
    try:
        assert runner(_square, 2) == 4
        idle_child = runner(os.getpid)
        os.kill(idle_child, signal.SIGKILL)
        _wait_until_gone(idle_child, reaped=True)  # Reaped: its pool has seen it die.
        assert runner(_square, 3) == 9
        assert runner(os.getpid) != idle_child
    finally:
        runner.close()


@pytest.mark.slow
def test_the_first_risky_decode_of_a_shard_waits_for_a_slow_start_up(tmp_path, monkeypatch):
    """The job's own path: a shard's first isolated decode on a worker whose child is slow to start."""
    gate = StartupGate(tmp_path / "gate", monkeypatch)
    gate.hold_interpreter_start()
    photo = tmp_path / "cat/0.tif"
    photo.parent.mkdir()
    photo.write_bytes(encode(real_photo("chelsea", (64, 48)), "TIFF"))
    shard = plan_dataset([InputFile("cat/0.tif", str(photo), label="cat")], num_shards=1, example_bytes=1).shards[0]
    out = tmp_path / "out"
    out.mkdir()
    fn = ConvertShardFn(ImageConfig(width=32, height=32, decode_timeout_s=_DECODE_TIMEOUT_S), str(out))
    fn.setup()
    try:
        outputs = _result_once_the_held_start_up_ends(gate, lambda: list(fn.process(shard)))
    finally:
        fn.teardown()
    results = [o for o in outputs if isinstance(o, ShardResult)]
    assert [r.dead_letters_by_reason for r in results] == [()]
    assert [r.num_examples for r in results] == [1]


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
    [
        ("JPEG", "risky", False),
        ("PNG", "risky", False),
        ("TIFF", "risky", True),
        ("GIF", "risky", True),
        ("WEBP", "risky", True),
        ("BMP", "risky", True),
        ("JPEG", "all", True),
        ("TIFF", "none", False),
    ],
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


@pytest.mark.slow
def test_a_shard_whose_decoder_cannot_start_fails_whole_and_blames_no_image(tmp_path, monkeypatch):
    """A worker that cannot start its decoder process fails the shard with one clear error: no
    dead letter for a file that was never decoded, and nothing staged for --resume to trust."""
    StartupGate(tmp_path / "gate", monkeypatch).kill_at_interpreter_start()
    photo = tmp_path / "cat/0.tif"
    photo.parent.mkdir()
    photo.write_bytes(encode(real_photo("chelsea", (64, 48)), "TIFF"))
    shard = plan_dataset([InputFile("cat/0.tif", str(photo), label="cat")], num_shards=1, example_bytes=1).shards[0]
    out = tmp_path / "out"
    out.mkdir()
    fn = ConvertShardFn(ImageConfig(width=32, height=32), str(out))
    fn.setup()
    try:
        with pytest.raises(DecoderStartupError, match="died twice before it could take a call"):
            list(fn.process(shard))
    finally:
        fn.teardown()
    assert sorted(os.listdir(out)) == []


@pytest.mark.parametrize(
    "field, value",
    [("timeout_s", 0), ("timeout_s", float("nan")), ("startup_timeout_s", -1), ("startup_timeout_s", float("inf"))],
)
def test_limits_that_are_not_positive_seconds_are_refused_naming_the_value(field, value):
    limits = {"timeout_s": 5, field: value}
    with pytest.raises(ValueError, match=rf"{field} must be a positive number of seconds \(got {value!r}\)"):
        IsolatedRunner(**limits)

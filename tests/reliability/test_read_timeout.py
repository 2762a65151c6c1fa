"""A read that never answers (a FIFO, a hung mount) costs its input a dead letter, not the run."""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError
from beam_jobs.imaging.reading import read_source
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from beam_jobs.writing.convert_shards import DEAD_LETTERS, ConvertShardFn


@pytest.fixture()
def fifo(tmp_path):
    """A FIFO with no writer; at the end its write end is opened once, so that a reader still
    blocked in open() returns (ENXIO there means none was waiting)."""
    path = tmp_path / "never.jpg"
    os.mkfifo(path)
    yield path
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_a_read_that_never_answers_is_a_read_timeout_dead_letter(fifo: pathlib.Path):
    """A FIFO with no writer blocks open() for ever: a real blocking read, as a hung mount gives.
    Whatever the machine's speed, it never answers, so the verdict is always read_timeout."""
    with pytest.raises(BadInputError) as caught:
        read_source(InputFile("never.jpg", str(fifo)), 1 << 20, timeout_s=0.5)
    assert caught.value.reason == "read_timeout" and "0.5 s" in caught.value.detail
    # The abandoned read is a daemon thread: released here, it ends; left, it would not hold the exit.
    blocked = [t for t in threading.enumerate() if t.name == "read-source-timed"]
    assert blocked and all(t.daemon for t in blocked)


def test_a_read_that_answers_is_unchanged_by_the_timeout(tmp_path):
    photo = make_photo_tree(tmp_path, num_images=1, seed=23)[0]
    assert read_source(InputFile("x.jpg", str(photo)), 1 << 24, timeout_s=60) == photo.read_bytes()
    with pytest.raises(BadInputError) as caught:
        read_source(InputFile("x.jpg", str(tmp_path / "missing.jpg")), 1 << 24, timeout_s=60)
    assert caught.value.reason == "read_error"


def test_a_shard_with_a_read_that_never_answers_is_written_without_it(fifo: pathlib.Path, tmp_path):
    """The conversion of a shard goes on past the hung read: its other inputs are written, and the
    hung one is a dead letter (a FIFO named by an input list stands for a hung mount here)."""
    photos = make_photo_tree(tmp_path / "img", num_images=2, seed=24)
    inputs = [InputFile(p.name, str(p), label="a") for p in photos] + [InputFile("never.jpg", str(fifo), label="a")]
    plan = plan_dataset(inputs, num_shards=1, example_bytes=1)
    out = tmp_path / "out"
    out.mkdir()
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        outputs = (
            p
            | beam.Create(plan.shards)
            | beam.ParDo(ConvertShardFn(ImageConfig(width=32, height=32), str(out), read_timeout_s=1.0)).with_outputs(
                DEAD_LETTERS, main="shards"
            )
        )
        assert_that(outputs.shards | beam.Map(lambda r: r.num_examples), equal_to([2]), label="CheckShards")
        assert_that(
            outputs[DEAD_LETTERS] | beam.Map(lambda d: (d.uri, d.reason)),
            equal_to([(str(fifo), "read_timeout")]),
            label="CheckDeadLetters",
        )


@pytest.mark.timeout(60)  # without the requeue, the stranded reads would wait for ever
def test_reads_queued_behind_a_hung_read_in_its_job_are_read_after_all(fifo: pathlib.Path, tmp_path):
    """A reader thread reads a few consecutive sources per job: those queued behind a read that
    never answers are queued again when it times out, so every other input still arrives, in order."""
    from beam_jobs.imaging.reading import SourceReaders  # pylint: disable=import-outside-toplevel

    photos = make_photo_tree(tmp_path / "img", num_images=9, seed=25)
    inputs = [InputFile("never.jpg", str(fifo))] + [InputFile(p.name, str(p)) for p in photos]
    readers = SourceReaders(2, timeout_s=0.5)
    try:
        read = [
            (item.filename, outcome)
            for item, outcome in readers.read_ahead(
                inputs, lambda f: read_source(f, 1 << 24, timeout_s=None), window=8, run=4
            )
        ]
    finally:
        readers.close()
    assert [name for name, _ in read] == [f.filename for f in inputs]
    assert isinstance(read[0][1], BadInputError) and read[0][1].reason == "read_timeout"
    assert [outcome for _, outcome in read[1:]] == [p.read_bytes() for p in photos]

"""Resuming mid-epoch in a new process: the run stopped after k batches and the resumed run,
together, are exactly the uninterrupted run (every key once, same order, same pixels), for
evaluation and for seeded training; by iterator checkpoint on one device (through the shard cache
too, with the cache emptied in between) and by `initial_step` under MirroredStrategy, also with
another number of replicas."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import tfdata_readers as tfr

_HERE = pathlib.Path(__file__).resolve().parent
TRAIN_SEED = 11  # as resume_check.py


def _run(*args: str, fails_with: str | None = None) -> list[list[str]]:
    out = pathlib.Path(args[0])
    proc = subprocess.run(
        [sys.executable, str(_HERE / "resume_check.py"), args[1], *args[:1], *args[2:]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if fails_with is not None:
        assert proc.returncode != 0 and fails_with in proc.stderr, proc.stderr[-4000:]
        return []
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _uninterrupted(data_dir, batch_size: int, steps: int, training: bool, **options) -> list[list[str]]:
    """The examples of `steps` batches of one run in this process, as resume_check.py lists them."""
    config = tfr.ReadConfig(dtype="uint8", num_epochs=None if training else 1)
    seeded = dict(training=True, seed=TRAIN_SEED) if training else {}
    dataset = tfr.make_dataset(data_dir, "train", batch_size, config=config, with_metadata=True, **seeded, **options)
    return [
        [key.decode(), hashlib.sha1(image.tobytes()).hexdigest()]
        for images, _, meta in dataset.take(steps)
        for key, image in zip(meta["key"].numpy(), images.numpy(), strict=True)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("cache", [False, True], ids=["local", "cache"])
def test_an_iterator_checkpoint_resumes_in_a_new_process_where_it_stopped(jpeg_dir, tmp_path, training, cache):
    steps = tfr.steps_per_epoch(jpeg_dir, "train", 5, drop_remainder=training)
    # Training goes on into the next epoch: the restored iterator must number it as the run would.
    total = 2 * steps if training else steps
    whole = _uninterrupted(jpeg_dir, 5, total, training)
    flags = (["--training"] if training else []) + (["--cache", str(tmp_path / "cache")] if cache else [])
    ckpt = str(tmp_path / "ckpt")
    stopped = _run(str(tmp_path / "a.json"), "save", str(jpeg_dir), ckpt, "3", *flags)
    if cache:
        shutil.rmtree(tmp_path / "cache")  # the restored reader downloads and verifies its shards again
    resumed = _run(str(tmp_path / "b.json"), "restore", str(jpeg_dir), ckpt, str(total - 3), *flags)
    assert len(stopped) == 15
    assert stopped + resumed == whole
    epoch = [key for key, _ in (stopped + resumed)[: 5 * steps]]
    assert len(set(epoch)) == len(epoch) == 5 * steps


@pytest.mark.slow
def test_a_checkpoint_restored_into_a_reader_built_differently_fails_loudly(jpeg_dir, tmp_path):
    """Another seed would go on from the saved positions in another order, silently: it is refused
    at the very first batch, before any batch of the saved prefetch buffer reaches a training step."""
    ckpt = str(tmp_path / "ckpt")
    _run(str(tmp_path / "a.json"), "save", str(jpeg_dir), ckpt, "3", "--training")
    _run(
        str(tmp_path / "b.json"),
        "restore",
        str(jpeg_dir),
        ckpt,
        "1",
        "--training",
        "--seed",
        "12",
        fails_with="restored from a checkpoint saved by a reader built differently",
    )


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_initial_step_resumes_mid_epoch_under_mirrored_strategy(jpeg_dir, tmp_path, training):
    """Stopped after 3 global steps on 2 replicas; resumed on 2, and on 3 (same global batch)."""
    global_batch = 6
    steps = tfr.steps_per_epoch(jpeg_dir, "train", global_batch, drop_remainder=training)
    epoch = 1 if training else 0
    more = steps - 3 + (2 if training else 0)  # training reads on into the next epoch
    whole = _uninterrupted(jpeg_dir, global_batch, steps + 2 if training else steps, training, initial_epoch=epoch)
    flags = ["--training"] if training else []
    gb = str(global_batch)
    stopped = _run(str(tmp_path / "a.json"), "step", str(jpeg_dir), gb, "3", "--replicas", "2", *flags)
    assert stopped == whole[: 3 * global_batch]
    for replicas in (2, 3):
        out = str(tmp_path / f"r{replicas}.json")
        resumed = _run(
            out, "step", str(jpeg_dir), gb, str(more), "--replicas", str(replicas), "--initial_step", "3", *flags
        )
        assert stopped + resumed == whole, f"resumed on {replicas} replicas"
    in_epoch = [key for key, _ in whole[: steps * global_batch]] if training else [key for key, _ in whole]
    assert len(set(in_epoch)) == len(in_epoch)
    if not training:
        assert len(in_epoch) == tfr.num_examples(jpeg_dir, "train")


def test_initial_step_skips_that_many_steps_and_counts_what_is_left(jpeg_dir):
    steps = tfr.steps_per_epoch(jpeg_dir, "train", 5)
    full = tfr.make_dataset(jpeg_dir, "train", 5, with_metadata=True, num_epochs=2)
    resumed = tfr.make_dataset(jpeg_dir, "train", 5, with_metadata=True, num_epochs=2, initial_step=4)
    assert int(resumed.cardinality()) == 2 * steps - 4
    keys = [list(meta["key"].numpy()) for _, _, meta in full]
    assert [list(meta["key"].numpy()) for _, _, meta in resumed] == keys[4:]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"initial_step": True}, "initial_step must be an int >= 0"),
        ({"initial_step": -1}, "initial_step must be an int >= 0"),
        ({"initial_step": 2, "training": True}, "initial_step in training needs num_epochs=None"),
        ({"initial_step": 10}, r"not within an epoch .* an epoch has 10 steps .* initial_epoch=1, initial_step=0"),
        ({"initial_step": 1, "data_service": "grpc://localhost:1"}, "cannot be used with data_service"),
    ],
)
def test_initial_step_that_cannot_resume_is_refused(jpeg_dir, options, message):
    with pytest.raises(ValueError, match=message):
        tfr.make_dataset(jpeg_dir, "train", 5, **options)

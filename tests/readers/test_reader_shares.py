"""Input pipelines get equal shares (to one example) of a split, whatever its shard count: audited by key."""

from __future__ import annotations

import collections
import itertools
import pathlib

import pytest
import reader_fixtures
import tensorflow as tf

import tfdata_readers
from tfdata_readers.audit import audit_epochs
from tfdata_readers.sources.manifest import ShardInfo

PIPELINES = (2, 3, 4)
# (examples, shards): 3, 4 and 5 files divide some pipeline counts and not others; 48 examples
# are a whole number of global batches for every pipeline count (global batch 2 x pipelines),
# 50 are not.
LAYOUTS = ((48, 3), (48, 4), (50, 5), (50, 3))
PER_PIPELINE_BATCH = 2
EPOCHS = 3


# The plan, as a pure function of the manifest's shard counts.


def _shards(counts: list[int]) -> tuple[ShardInfo, ...]:
    return tuple(ShardInfo(f"s{i}", n, 0, "") for i, n in enumerate(counts))


@pytest.mark.parametrize("counts", [[20, 20, 20], [10] * 4, [9, 9, 8, 8, 8], [7], [0, 5, 0, 6], [1, 1], [3, 40, 2]])
@pytest.mark.parametrize("pipelines", [1, 2, 3, 4, 8])
def test_shares_partition_the_records_into_ranges_differing_by_at_most_one(counts: list[int], pipelines: int) -> None:
    from tfdata_readers.sources.files import plan_pipeline_share

    shards = _shards(counts)
    shares = [plan_pipeline_share(shards, pipelines, i) for i in range(pipelines)]
    sizes = [s.num_examples for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == sum(counts)
    owner = {}  # (shard, record) -> pipeline
    for share in shares:
        assert sum(p.take for p in share.pieces) == share.num_examples
        partial = [p for p in share.pieces if p.take < p.shard_examples]
        assert len(partial) <= 2  # only the first and last piece may cut a shard
        for piece in share.pieces:
            assert piece.take > 0 and 0 <= piece.skip and piece.skip + piece.take <= piece.shard_examples
            for record in range(piece.skip, piece.skip + piece.take):
                assert (piece.path, record) not in owner
                owner[piece.path, record] = share.pipeline_id
    assert len(owner) == sum(counts)  # every record has exactly one pipeline


# The reader, pipeline by pipeline, with InputContexts built as tf.distribute builds them.


@pytest.fixture(scope="module")
def layout_dirs(tmp_path_factory) -> dict[tuple[int, int], pathlib.Path]:
    root = tmp_path_factory.mktemp("shares")
    return {
        (n, k): reader_fixtures.write_dataset(root / f"n{n}k{k}", splits={"train": (n, k)}, image_size=(8, 8), seed=k)
        for n, k in LAYOUTS
    }


def _context(pipelines: int, pipeline_id: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines
    )


def _batches(dataset: tf.data.Dataset, limit: int | None = None) -> list[list[str]]:
    """The keys of each batch, up to `limit` batches."""
    return [[k.decode() for k in meta["key"].numpy()] for _, _, meta in itertools.islice(dataset, limit)]


@pytest.mark.parametrize("pipelines", PIPELINES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"{n}ex-{k}shards" for n, k in LAYOUTS])
def test_training_pipelines_see_every_example_at_the_same_rate(layout_dirs, layout, pipelines: int) -> None:
    """The README's recipe: num_epochs=None, and steps_per_epoch from the manifest. Over 3 epochs of
    steps, every epoch (the union over pipelines of that epoch's steps) delivers each example at
    most once and drops fewer than one global batch; so no example is seen more than once more
    often than another."""
    data_dir = layout_dirs[layout]
    expected = reader_fixtures.expected_keys(data_dir, "train")
    global_batch = PER_PIPELINE_BATCH * pipelines
    steps = tfdata_readers.steps_per_epoch(data_dir, "train", global_batch)
    per_pipeline = []
    for pipeline_id in range(pipelines):
        ds = tfdata_readers.make_dataset(
            data_dir,
            "train",
            PER_PIPELINE_BATCH,
            input_context=_context(pipelines, pipeline_id),
            training=True,
            seed=5,
            num_epochs=None,
            with_metadata=True,
        )
        batches = _batches(ds, EPOCHS * steps)
        assert len(batches) == EPOCHS * steps and all(len(b) == PER_PIPELINE_BATCH for b in batches)
        per_pipeline.append(batches)
    epochs = [
        [key for batches in per_pipeline for batch in batches[e * steps : (e + 1) * steps] for key in batch]
        for e in range(EPOCHS)
    ]
    assert audit_epochs(epochs, expected, training=True, global_batch_size=global_batch) == []
    if len(expected) % global_batch == 0:  # nothing to drop: every key exactly once an epoch
        assert set(collections.Counter(key for epoch in epochs for key in epoch).values()) == {EPOCHS}


@pytest.mark.parametrize("pipelines", PIPELINES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"{n}ex-{k}shards" for n, k in LAYOUTS])
def test_pipelines_agree_on_batches_per_epoch_and_evaluate_exactly_once(layout_dirs, layout, pipelines: int) -> None:
    data_dir = layout_dirs[layout]
    expected = sorted(reader_fixtures.expected_keys(data_dir, "train"))
    steps = tfdata_readers.steps_per_epoch(data_dir, "train", PER_PIPELINE_BATCH * pipelines)
    train_batches, eval_counts, eval_keys = [], [], []
    for pipeline_id in range(pipelines):
        context = _context(pipelines, pipeline_id)
        train = tfdata_readers.make_dataset(
            data_dir,
            "train",
            PER_PIPELINE_BATCH,
            input_context=context,
            training=True,
            seed=2,
            with_metadata=True,
        )
        train_batches.append(len(_batches(train)))  # the default num_epochs=1: one epoch
        keys = [
            k
            for batch in _batches(
                tfdata_readers.make_dataset(
                    data_dir,
                    "train",
                    PER_PIPELINE_BATCH,
                    input_context=context,
                    with_metadata=True,
                )
            )
            for k in batch
        ]
        eval_counts.append(len(keys))
        eval_keys += keys
    # Under MultiWorkerMirroredStrategy a pipeline that runs out early stalls or fails the step.
    assert train_batches == [steps] * pipelines
    assert sorted(eval_keys) == expected
    assert max(eval_counts) - min(eval_counts) <= 1, eval_counts


@pytest.mark.parametrize("replicas", [2, 3, 4])
@pytest.mark.parametrize("layout", [(48, 3), (50, 5)], ids=["48ex-3shards", "50ex-5shards"])
def test_one_pipeline_feeding_several_replicas_yields_whole_global_steps(layout_dirs, layout, replicas: int) -> None:
    """MirroredStrategy on one machine: one pipeline (num_input_pipelines=1) feeds every replica. Its
    epoch must be exactly steps_per_epoch x replicas batches; one batch more would make the last
    global step join two passes, and with num_epochs=None hold the same example twice."""
    data_dir = layout_dirs[layout]
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas)
    steps = tfdata_readers.steps_per_epoch(data_dir, "train", PER_PIPELINE_BATCH * replicas)
    ds = tfdata_readers.make_dataset(
        data_dir,
        "train",
        PER_PIPELINE_BATCH,
        input_context=context,
        training=True,
        seed=3,
        with_metadata=True,
    )
    assert len(_batches(ds)) == steps * replicas
    repeated = tfdata_readers.make_dataset(
        data_dir,
        "train",
        PER_PIPELINE_BATCH,
        input_context=context,
        training=True,
        seed=3,
        with_metadata=True,
        num_epochs=None,
    )
    batches = _batches(repeated, EPOCHS * steps * replicas)
    for step in range(EPOCHS * steps):  # the strategy deals `replicas` consecutive batches to one global step
        keys = [k for batch in batches[step * replicas : (step + 1) * replicas] for k in batch]
        assert len(keys) == len(set(keys)) == PER_PIPELINE_BATCH * replicas, step
    for epoch in range(EPOCHS):
        keys = [k for batch in batches[epoch * steps * replicas : (epoch + 1) * steps * replicas] for k in batch]
        assert len(keys) == len(set(keys)), epoch

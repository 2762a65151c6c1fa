"""`make_dataset`: the reader, as a list of named stages (see `tfdata_readers/stages/`).

plan        manifest, split, options -> ReaderPlan (every check, every derived number)
pieces      -> (path, records, skip, take, bytes) per shard piece of this pipeline's share
records     -> (serialized, name), interleaved, local or through the verified cache
passes      -> each epoch's shuffled (or one fixed order of) [B] batches of records
decode      -> (image [B,H,W,C], label [B][, weight][, metadata]) or (image, targets[, metadata])
ending      -> step count, prefetch, checkpoint identity check, options, the tf.data service
"""

from __future__ import annotations

import functools
import os
from typing import Any

import tensorflow as tf

from tfdata_readers.config import ReadConfig
from tfdata_readers.sources import storage
from tfdata_readers.stages.ending import finish_reader
from tfdata_readers.stages.passes import evaluation_passes, training_passes
from tfdata_readers.stages.plan import plan_reader
from tfdata_readers.stages.records import open_cache, piece_dataset, read_pieces, s3_options

__all__ = ["make_dataset", "s3_options"]


def make_dataset(
    data_dir: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    training: bool = False,
    seed: int | None = None,
    initial_epoch: int = 0,
    initial_step: int = 0,
    input_context: tf.distribute.InputContext | None = None,
    with_metadata: bool = False,
    config: ReadConfig | None = None,
    version: int | None = None,
    **options: Any,
) -> tf.data.Dataset:
    """A dataset of `(image, label)` batches (plus a weight with `class_weights`, then a metadata
    dict with `with_metadata`).

    `image` is float32 [B, H, W, C] (scaled by `config.scale`, [0, 1] by default; uint8 0-255 with
    `dtype="uint8"`), `label` int64 [B], the weight float32 [B].
    Each iteration is one epoch (`num_epochs` of them). With `training`, shard pieces and records
    are shuffled and each example is augmented with stateless ops, all seeded from (`seed`, the
    epoch, and for augmentation the example's key); otherwise there is no randomness, and every
    pass yields the same order. The epochs are numbered from `initial_epoch` (an int >= 0): the
    first pass of the first iteration is that epoch, and each pass after it the next, so a trainer
    resuming at epoch k (Keras `BackupAndRestore`, `fit(initial_epoch=k)`) gets exactly the order,
    shuffles and crops an uninterrupted run had from epoch k on. `initial_step` (an int >= 0) resumes
    within that epoch: the global steps of epoch `initial_epoch` already taken are skipped, by
    reading their records without decoding them, so the batches that follow are exactly those an
    uninterrupted run had next (see docs/reading.md, "Resuming mid-epoch"). See `ReadConfig` for exactly what
    a seed reproduces. `input_context` (from `distribute`) selects this pipeline's share of the
    data: a contiguous range of the split's records, equal to one record across pipelines.
    `options` override fields of `config` (see `ReadConfig`). `batch_size` is a positive int (not a
    bool); `seed` is None or an int (not a bool) with 0 <= seed < 2**63.

    `version` is the dataset version to read: None (default) is the current one (the root
    dataset_info.json), an int N that version's manifest (see `load_manifest`). Either way the
    manifest is read once, here: the dataset holds that version's shard paths, so every epoch of
    every iterator reads the same version, whatever is committed meanwhile (the writer never
    rewrites a committed file, and keeps old versions' files for its retention window).

    `cardinality()` is the true number of batches (per epoch times `num_epochs`; INFINITE with
    `num_epochs=None`), from the manifest, so Keras shows the step total. It is unknown only where
    it cannot be known in advance: with `skip_corrupt` (unless the pipeline is held to a fixed
    count under tf.distribute) and through the tf.data service.

    With `data_service` ("grpc://HOST:PORT"), the same pipeline runs on the tf.data service's
    workers and this dataset only fetches its batches (see `tfdata_readers.service.reading`).
    """
    config = (config or ReadConfig()).with_options(**options)
    with storage.using(s3_options(config)):
        return _make_dataset(
            data_dir,
            split,
            batch_size,
            training=training,
            seed=seed,
            initial_epoch=initial_epoch,
            initial_step=initial_step,
            input_context=input_context,
            with_metadata=with_metadata,
            config=config,
            version=version,
        )


def _make_dataset(
    data_dir: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    training: bool,
    seed: int | None,
    initial_epoch: int,
    initial_step: int,
    input_context: tf.distribute.InputContext | None,
    with_metadata: bool,
    config: ReadConfig,
    version: int | None,
) -> tf.data.Dataset:
    """`make_dataset` with its options resolved, its S3 store in effect."""
    plan = plan_reader(
        data_dir,
        split,
        batch_size,
        training=training,
        seed=seed,
        initial_epoch=initial_epoch,
        initial_step=initial_step,
        input_context=input_context,
        with_metadata=with_metadata,
        config=config,
        version=version,
    )
    pieces = piece_dataset(plan)  # (path, records in shard, skip, take, shard bytes)
    read = functools.partial(read_pieces, plan, open_cache(plan))  # pieces -> (serialized, name)
    passes = training_passes if training else evaluation_passes
    return finish_reader(plan, passes(plan, pieces, read))  # (image, label, ...) batches

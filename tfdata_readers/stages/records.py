"""Shard pieces -> records: this pipeline's pieces, interleaved, read locally or through the cache.

A piece is a contiguous range of one shard's records (`sources/files.py` deals them to the
pipelines); its records come as (serialized, name) pairs, the name saying shard, record and offset
so that a parse error can name them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdata_readers.sources import storage
from tfdata_readers.sources.cached_reading import CachedShards, shared_cache
from tfdata_readers.sources.records import read_shard
from tfdata_readers.stages.plan import ReaderPlan

__all__ = ["open_cache", "piece_dataset", "read_pieces", "s3_options"]


def s3_options(config: Any) -> storage.S3Options | None:
    """The S3 store `config` (a ReadConfig) names, None where it leaves both to the AWS default chain."""
    if config.s3_endpoint_url is None and config.s3_profile is None:
        return None
    return storage.S3Options(endpoint_url=config.s3_endpoint_url, profile=config.s3_profile)


def piece_dataset(plan: ReaderPlan) -> tf.data.Dataset:
    """(path, records in the shard, records to skip, records to take, shard bytes) per shard piece
    this pipeline reads, in the share's order."""
    pieces = plan.share.pieces
    shard_bytes = {s.path: s.bytes for s in plan.split_info.shards}
    return tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([p.path for p in pieces], tf.string),
            tf.constant([p.shard_examples for p in pieces], tf.int64),
            tf.constant([p.skip for p in pieces], tf.int64),
            tf.constant([p.take for p in pieces], tf.int64),
            tf.constant([shard_bytes[p.path] for p in pieces], tf.int64),
        )
    )


def open_cache(plan: ReaderPlan) -> CachedShards | None:
    """With a cache, each shard piece is read from a verified local copy (cached_reading.py)."""
    config = plan.config
    if config.cache_dir is None:
        return None
    return CachedShards(
        shared_cache(config.cache_dir, config.cache_limit_bytes, s3_options(config)),
        plan.split_info.shards,
        open_at_once=plan.cycle_length,
        where=f"split {plan.split!r}",
    )


def read_pieces(plan: ReaderPlan, through_cache: CachedShards | None, pieces: tf.data.Dataset) -> tf.data.Dataset:
    """`piece_dataset` elements, in this pass's order -> (serialized, name) records."""
    config = plan.config

    def read_piece(path: tf.Tensor, count: tf.Tensor, skip: tf.Tensor, take: tf.Tensor, size: tf.Tensor):
        def read(local: tf.Tensor) -> tf.data.Dataset:
            return read_shard(
                local,
                count,
                skip,
                take,
                expected_bytes=size,
                buffer_size=config.read_buffer_size,
                skip_corrupt=config.skip_corrupt,
                # A service worker cannot call back into this process's Python to re-read the shard for
                # TensorFlow's reason; the error still names the shard and the byte offset.
                describe_errors=not plan.service,
            )

        if through_cache is None:
            return read(path)
        return through_cache.read_through(path, read)

    if through_cache is not None and config.cache_lookahead:
        # The prefetch pulls the next pieces, in this pass's order, ahead of the interleave: their
        # downloads start while the pieces before them are read.
        pieces = pieces.map(lambda path, *rest: (through_cache.announce(path), *rest)).prefetch(config.cache_lookahead)
    records = pieces.interleave(
        read_piece,
        cycle_length=plan.cycle_length,
        block_length=config.block_length,
        # Through the cache, the pieces open are exactly `cycle_length`: a parallel interleave also
        # opens pieces ahead, whose leases would take a small cache over its limit (the start-up
        # check counts `cycle_length`). Reading local copies one record at a time is not what
        # limits speed.
        **(
            dict(num_parallel_calls=config.num_parallel_reads, deterministic=plan.deterministic)
            if through_cache is None
            else {}
        ),
    )  # (serialized, name)
    if config.skip_corrupt and plan.records_needed is not None:
        needed = plan.records_needed
        records = _require_records(
            records,
            needed,
            f"tfdata_readers: input pipeline {plan.pipeline_id} of {plan.share.num_pipelines} (split {plan.split!r} "
            f"of {plan.data_dir}) read fewer than the {needed} records it needs for the "
            f"{plan.batches_per_epoch} batches of {plan.batch_size} that every pipeline must yield per epoch under "
            f"tf.distribute: skip_corrupt=True skipped corrupt records of its share (see skipped_records() "
            f"and the warnings above). Yielding fewer batches would make pipelines disagree on step counts "
            f"and global steps straddle two passes, so the reader stops instead. Repair or re-convert the "
            f"shard (python -m tfdata_readers.verify names it), or evaluate (drop_remainder=False), "
            f"which reads what is left. Records read:",
        )
    return records


def _require_records(records: tf.data.Dataset, needed: int, message: str) -> tf.data.Dataset:
    """`records` ((serialized, name) pairs), failing with `message` at their end if there were fewer
    than `needed`. Only used with `skip_corrupt` under tf.distribute, where a pipeline that lost more
    records than its share can spare would yield fewer batches than the others."""
    end = tf.data.Dataset.from_tensors((tf.constant(""), tf.constant(""), tf.constant(True)))
    marked = records.map(lambda serialized, name: (serialized, name, tf.constant(False))).concatenate(end)

    def count(read: tf.Tensor, element: tuple[tf.Tensor, tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, Any]:
        serialized, name, is_end = element
        ok = tf.logical_or(tf.logical_not(is_end), read >= needed)
        checked = tf.debugging.Assert(ok, [message, read], summarize=1)
        with tf.control_dependencies([checked]):
            return read + tf.cast(tf.logical_not(is_end), tf.int64), (tf.identity(serialized), name, is_end)

    return (
        marked.scan(tf.constant(0, tf.int64), count)
        .filter(lambda serialized, name, is_end: tf.logical_not(is_end))
        .map(lambda serialized, name, is_end: (serialized, name))
    )

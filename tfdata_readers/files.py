"""The shard files one input pipeline reads: checked at start-up, split across pipelines by InputContext."""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from tfdata_readers.manifest import ShardInfo, SplitInfo

__all__ = ["ShardError", "PipelineFiles", "check_shards", "files_for_pipeline"]

logger = logging.getLogger(__name__)


class ShardError(IOError):
    """A shard file is missing, has the wrong size, or does not match its manifest entry."""


def check_shards(shards: tuple[ShardInfo, ...]) -> None:
    """Fails naming the first shard that is missing or whose byte size differs from the manifest."""
    for shard in shards:
        if not tf.io.gfile.exists(shard.path):
            raise ShardError(f"shard {shard.path} is listed in the manifest but does not exist")
        size = tf.io.gfile.stat(shard.path).length
        if size != shard.bytes:
            raise ShardError(f"shard {shard.path} has {size} bytes; the manifest says {shard.bytes}")


@dataclasses.dataclass(frozen=True)
class PipelineFiles:
    """What one input pipeline reads.

    `shard_elements` is None when the pipeline owns whole files; otherwise the pipeline reads all
    files and keeps every `num_pipelines`-th element starting at `pipeline_id`.
    """

    shards: tuple[ShardInfo, ...]
    shard_elements: tuple[int, int] | None  # (num_pipelines, pipeline_id)


def files_for_pipeline(
    split: SplitInfo, input_context: tf.distribute.InputContext | None
) -> PipelineFiles:
    """Shards by file when there are at least as many files as pipelines, else falls back to elements."""
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    if num_pipelines == 1:
        return PipelineFiles(split.shards, None)
    if len(split.shards) >= num_pipelines:
        # Whole files per pipeline: no pipeline reads bytes another one will throw away.
        return PipelineFiles(split.shards[pipeline_id::num_pipelines], None)
    logger.warning(
        "split %r has %d shard files for %d input pipelines: sharding by element instead of by file "
        "(every pipeline reads every file and keeps 1/%d of the records). Write at least %d shards "
        "to avoid this.",
        split.name, len(split.shards), num_pipelines, num_pipelines, num_pipelines,
    )
    return PipelineFiles(split.shards, (num_pipelines, pipeline_id))

"""The shard files one input pipeline reads: checked at start-up, split across pipelines by InputContext."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable

import tensorflow as tf

from tfdata_readers.manifest import MANIFEST_NAME, DatasetInfo, ShardInfo, SplitInfo

__all__ = [
    "SHARD_NAME",
    "ShardError",
    "PipelineFiles",
    "check_no_unlisted_shards",
    "check_shards",
    "files_for_pipeline",
    "unlisted_shards",
]

logger = logging.getLogger(__name__)


class ShardError(IOError):
    """A shard file is missing, has the wrong size, or is in the data dir but not in the manifest."""


def check_shards(shards: tuple[ShardInfo, ...]) -> None:
    """Fails naming the first shard that is missing or whose byte size differs from the manifest."""
    for shard in shards:
        if not tf.io.gfile.exists(shard.path):
            raise ShardError(f"shard {shard.path} is listed in the manifest but does not exist")
        size = tf.io.gfile.stat(shard.path).length
        if size != shard.bytes:
            raise ShardError(f"shard {shard.path} has {size} bytes; the manifest says {shard.bytes}")


# A final shard name (docs/FORMAT.md); the writer's hidden staged and temp names start with ".".
SHARD_NAME = re.compile(r"^(?P<split>[^.].*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord$")


def unlisted_shards(info: DatasetInfo, splits: Iterable[str] | None = None) -> list[str]:
    """Paths of files in the data dir named like a shard of `splits` (None: any split) that the manifest
    does not list: a stale shard of an earlier run, or one copied in by hand.

    The reader never reads them (its file list comes only from the manifest); listing the folder
    is only for this check, so that such a disagreement fails loudly instead of being ignored.
    """
    wanted = None if splits is None else set(splits)
    listed = {os.path.basename(s.path) for split in info.splits.values() for s in split.shards}
    unlisted = []
    for name in sorted(tf.io.gfile.listdir(info.data_dir)):
        name = name.rstrip("/")
        match = SHARD_NAME.match(name)
        if match and name not in listed and (wanted is None or match["split"] in wanted):
            unlisted.append(os.path.join(info.data_dir, name))
    return unlisted


def check_no_unlisted_shards(info: DatasetInfo, split: str) -> None:
    """Fails naming every file that looks like a shard of `split` but is not in the manifest."""
    unlisted = unlisted_shards(info, [split])
    if unlisted:
        raise ShardError(
            f"{', '.join(unlisted)} look(s) like shard(s) of split {split!r} but "
            f"{os.path.join(info.data_dir, MANIFEST_NAME)} does not list them; remove them or rerun "
            f"the conversion job into a clean directory"
        )


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

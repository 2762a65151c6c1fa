"""The shard pieces one input pipeline reads: checked at start-up, split across pipelines by InputContext."""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
from collections.abc import Iterable

import tensorflow as tf

from tfdata_readers.sources import storage
from tfdata_readers.sources.manifest import (
    VERSIONS_DIR,
    DatasetInfo,
    ShardInfo,
    SplitInfo,
    history_files,
    shard_file_problem,
)

__all__ = [
    "SHARD_NAME",
    "ShardError",
    "PipelineShare",
    "ShardPiece",
    "check_no_unlisted_shards",
    "check_shards",
    "old_version_note",
    "plan_pipeline_share",
    "record_range",
    "share_for_pipeline",
    "unlisted_shards",
]

logger = logging.getLogger(__name__)


class ShardError(IOError):
    """A shard file is missing, has the wrong size, or is in the data dir but not in the manifest."""


def check_shards(shards: tuple[ShardInfo, ...], *, skip_corrupt: bool = False, missing_note: str = "") -> None:
    """Fails naming the first shard that is missing or whose byte size differs from the manifest.

    With `skip_corrupt` a size mismatch (a truncated shard) is only logged as a warning: reading
    then stops at the first missing or unreadable record, and the records lost are counted
    (`skipped_records()`). A missing shard always fails, with `missing_note` added (see
    `old_version_note`).
    """
    for shard in shards:
        try:
            size = storage.size(shard.path)
        except FileNotFoundError:
            raise ShardError(f"shard {shard.path} is listed in the manifest but does not exist{missing_note}") from None
        if size != shard.bytes:
            message = f"shard {shard.path} has {size} bytes; the manifest says {shard.bytes}"
            if not skip_corrupt:
                raise ShardError(message)
            logger.warning("%s; skip_corrupt=True: reading it anyway, and counting the records lost", message)


def old_version_note(info: DatasetInfo, current: int | None) -> str:
    """What a missing shard of an older version most likely means, for the error ("" for the current version)."""
    if current is None or info.version == current:
        return ""
    return (
        f": version {info.version} ({info.manifest_path}) is not the current version ({current}), and the "
        f"writer deletes the files of versions outside its retention window (python -m beam_jobs.versions "
        f"list shows which versions still have their files)"
    )


# A final shard name (docs/FORMAT.md); the writer's hidden staged and temp names start with ".".
SHARD_NAME = re.compile(r"^(?P<split>[^.].*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord$")


def unlisted_shards(info: DatasetInfo, splits: Iterable[str] | None = None) -> list[str]:
    """Paths of files named like a shard of `splits` (None: any split), in a folder that holds the
    manifest's shards, that no manifest of the dataset lists: a stale shard of an earlier run, or
    one copied in by hand among the writer's own.

    The reader never reads them (its file list comes only from the manifest); listing the folders
    is only for this check, so that such a disagreement fails loudly instead of being ignored.
    Only the folders the writer put this version's shards in are looked into: the run folders
    under shards/ (or the data dir itself, for a dataset written before run folders). Files of the
    user's own beside dataset_info.json, even named like shards, are then none of the dataset's
    business, as the writer promises. A file that another version's manifest (versions/*.json)
    lists is not stale: the writer keeps old versions' files for its retention window (after an
    overwrite of a dataset written before versioning, its shards stay beside the new run's folder).
    """
    wanted = None if splits is None else set(splits)
    # Compared as paths relative to the data dir: shards/<run>/train-00000-of-00004.tfrecord does
    # not list a train-00000-of-00004.tfrecord beside dataset_info.json.
    listed = {s.file for split in info.splits.values() for s in split.shards}
    # A file entry that leaves the data dir is a problem of its own (verify reports it): its
    # folder is not listed.
    folders = sorted({posixpath.dirname(file) for file in listed if not shard_file_problem(file)})
    candidates = []
    for folder in folders:
        try:
            names = storage.listdir(os.path.join(info.data_dir, folder) if folder else info.data_dir)
        except tf.errors.NotFoundError:
            continue  # a missing shard's folder: the shard itself is reported as missing
        for name in sorted(names):
            name = name.rstrip("/")
            file = posixpath.join(folder, name) if folder else name
            match = SHARD_NAME.match(name)
            if match and file not in listed and (wanted is None or match["split"] in wanted):
                candidates.append(file)
    if candidates:  # Only then are the history manifests read.
        kept = history_files(info.data_dir)
        candidates = [file for file in candidates if file not in kept]
    return [os.path.join(info.data_dir, file) for file in candidates]


def check_no_unlisted_shards(info: DatasetInfo, split: str) -> None:
    """Fails naming every file that looks like a shard of `split` but is not in any manifest."""
    unlisted = unlisted_shards(info, [split])
    if unlisted:
        raise ShardError(
            f"{', '.join(unlisted)} look(s) like shard(s) of split {split!r} but "
            f"{info.manifest_path} does not list them (nor does any manifest in "
            f"{os.path.join(info.data_dir, VERSIONS_DIR)}); remove them or rerun the conversion job into a "
            f"clean directory"
        )


@dataclasses.dataclass(frozen=True)
class ShardPiece:
    """Records `skip` to `skip + take` (0-based, in file order) of one shard file."""

    path: str
    skip: int
    take: int
    shard_examples: int  # the manifest's count for the whole shard


@dataclasses.dataclass(frozen=True)
class PipelineShare:
    """What one input pipeline reads: a contiguous range of the split's records, as shard pieces.

    `start`/`stop` index the split's global record sequence (its shards concatenated in manifest
    order); `pieces` are the (path, skip, take) parts of the shards that overlap that range.
    """

    pieces: tuple[ShardPiece, ...]
    start: int
    stop: int
    num_pipelines: int
    pipeline_id: int

    @property
    def num_examples(self) -> int:
        """How many records this pipeline reads: the length of its range."""
        return self.stop - self.start

    def shards(self, split: SplitInfo) -> tuple[ShardInfo, ...]:
        """The manifest entries of the shard files this pipeline opens."""
        paths = {piece.path for piece in self.pieces}
        return tuple(s for s in split.shards if s.path in paths)


def record_range(num_examples: int, num_pipelines: int, pipeline_id: int) -> tuple[int, int]:
    """[start, stop) of pipeline `pipeline_id`'s share of `num_examples` records: contiguous ranges
    whose sizes differ by at most one (the first `num_examples % num_pipelines` get one more)."""
    if num_pipelines < 1 or not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"pipeline_id {pipeline_id!r} is not in range for {num_pipelines!r} input pipelines")
    base, extra = divmod(num_examples, num_pipelines)
    start = pipeline_id * base + min(pipeline_id, extra)
    return start, start + base + (1 if pipeline_id < extra else 0)


def plan_pipeline_share(shards: tuple[ShardInfo, ...], num_pipelines: int, pipeline_id: int) -> PipelineShare:
    """The pieces of `shards` (in manifest order) holding pipeline `pipeline_id`'s record range.

    A pure function of the manifest, so every pipeline computes its share without talking to the
    others, and the shares partition the split: every record belongs to exactly one pipeline.
    Only the first and last piece of a share can be part of a shard; every other piece is a
    whole file.
    """
    total = sum(s.num_examples for s in shards)
    start, stop = record_range(total, num_pipelines, pipeline_id)
    pieces = []
    offset = 0  # global index of the shard's first record
    for shard in shards:
        lo, hi = max(start, offset), min(stop, offset + shard.num_examples)
        if lo < hi:
            pieces.append(ShardPiece(shard.path, lo - offset, hi - lo, shard.num_examples))
        offset += shard.num_examples
    return PipelineShare(tuple(pieces), start, stop, num_pipelines, pipeline_id)


def share_for_pipeline(split: SplitInfo, input_context: tf.distribute.InputContext | None) -> PipelineShare:
    """This pipeline's share of `split`: an equal (to one record) contiguous range of its records.

    Dealing whole files (`shards[i::n]`) gives pipelines unequal shares whenever the shard count is
    not a multiple of the pipeline count (3 files for 2 pipelines: 2/3 and 1/3 of the data), so
    under multi-worker training some examples would be seen at twice the rate of others, and one
    pipeline could run out mid-epoch. Sharding by element (every pipeline reads every file and
    keeps 1/n) is balanced but reads n times the bytes. Splitting the record sequence into
    contiguous ranges is both exact and cheap: a pipeline reads whole files except at most two
    shards it shares with a neighbour, where it skips the records before its range (reading but
    not decoding them) and stops reading at the end of its range.
    """
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    share = plan_pipeline_share(split.shards, num_pipelines, pipeline_id)
    if num_pipelines > 1 and share.num_examples == 0:
        logger.warning(
            "split %r has %d examples for %d input pipelines: pipeline %d has no data",
            split.name,
            split.num_examples,
            num_pipelines,
            pipeline_id,
        )
    return share

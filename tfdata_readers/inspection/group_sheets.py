"""The largest split groups of a dataset made with split groups, as their members' pictures.

A group (near-copies, a patient, a video) is in one split by construction; a contact sheet of
each of the largest shows what the rule joined: re-encodes and crops of one photo, or a chain of
look-alikes that single linkage made one group. The manifest names the largest groups
(``split_groups.largest_groups``) with their first members by name; each shard's sidecar names
its inputs (``input_filenames``, docs/FORMAT.md), so only the shards that hold those members are
read, as stored (the image as written, not a training view). A manifest that names no members
(made before it did) is drawn from the group ids the sidecars record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable

import numpy as np
import tensorflow as tf

from tfdata_readers.inspection.gather import Inspection, SampleExample
from tfdata_readers.sources import storage
from tfdata_readers.sources.manifest import DatasetInfo, read_shard_sidecar
from tfdata_readers.sources.records import tensorflow_reason

__all__ = ["GroupSample", "largest_group_samples", "with_largest_groups"]

# Groups drawn, and members drawn per group: a sheet is a look, not a listing.
SHOWN_GROUPS = 3
SHOWN_MEMBERS = 24


@dataclasses.dataclass(frozen=True)
class GroupSample:
    """Some members of one of the largest groups, each captioned with its split and class."""

    group: str
    size: int  # members the manifest counts, dead letters included
    splits: tuple[str, ...]  # the splits its drawn members are in: one, unless the user gave two
    examples: tuple[SampleExample, ...]


def _members_by_shard(info: DatasetInfo, largest: list[dict]) -> dict[tuple[str, str], dict[str, str]]:
    """{(split, shard path): {name: group id} of the members of ``largest`` it holds}, from the
    sidecars; a sidecar that cannot be read (a dataset copied without them) holds none."""
    named = {name: entry["id"] for entry in largest for name in entry.get("members", [])}
    ids = {entry["id"] for entry in largest}
    found: dict[tuple[str, str], dict[str, str]] = {}
    for split in sorted(info.splits):
        for shard in info.split(split).shards:
            sidecar = read_shard_sidecar(shard.path) or {}
            names = sidecar.get("input_filenames")
            if not isinstance(names, list):
                continue
            recorded = sidecar.get("input_groups") or [None] * len(names)
            if named:  # the manifest's own members: exact, also for held examples an append grouped anew
                members = {name: named[name] for name in names if name in named}
            else:
                members = {name: group for name, group in zip(names, recorded, strict=False) if group in ids}
            if members:
                found[(split, shard.path)] = members
    return found


def _records(path: str, names: Container[str]) -> Iterable[dict]:
    """The parsed records of one shard whose filename is in ``names``."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/class/text": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }
    with storage.local_copy(path) as local:
        for record in tf.data.TFRecordDataset([local]).as_numpy_iterator():
            example = tf.io.parse_single_example(record, spec)
            if example["image/filename"].numpy().decode("utf-8", "replace") in names:
                yield example


def largest_group_samples(
    info: DatasetInfo, *, groups: int = SHOWN_GROUPS, members: int = SHOWN_MEMBERS
) -> list[GroupSample]:
    """The ``groups`` largest groups the manifest names, each with up to ``members`` of its
    examples by name; none for a dataset made without split groups."""
    largest = [entry for entry in (info.raw.get("split_groups") or {}).get("largest_groups", []) if entry["inputs"] > 1]
    largest = largest[:groups]
    if not largest:
        return []
    members_of = _members_by_shard(info, largest)
    # The first ``members`` of each group by name: the only ones decoded, whatever the group's size.
    names: dict[str, list[str]] = {}
    for shard_members in members_of.values():
        for name, group in shard_members.items():
            names.setdefault(group, []).append(name)
    drawn_names = {name for group_names in names.values() for name in sorted(group_names)[:members]}
    members_of = {
        shard: {name: group for name, group in shard_members.items() if name in drawn_names}
        for shard, shard_members in members_of.items()
    }
    by_group: dict[str, list[tuple[str, SampleExample]]] = {entry["id"]: [] for entry in largest}
    for (split, path), group_of in sorted(members_of.items()):
        if not group_of:
            continue
        for example in _records(path, group_of):
            name = example["image/filename"].numpy().decode("utf-8", "replace")
            image = tf.io.decode_image(example["image/encoded"], channels=3, expand_animations=False).numpy()
            tile = SampleExample(
                label_id=int(example["image/class/label"]),
                label=f"{split}: {example['image/class/text'].numpy().decode('utf-8', 'replace')}",
                filename=name,
                key=split,
                image=np.asarray(image, np.uint8),
            )
            by_group[group_of[name]].append((name, tile))
    samples = []
    for entry in largest:
        drawn = [tile for _, tile in sorted(by_group[entry["id"]], key=lambda item: item[0])]
        samples.append(
            GroupSample(
                group=entry["id"],
                size=int(entry["inputs"]),
                splits=tuple(sorted({tile.key for tile in drawn})),
                examples=tuple(drawn),
            )
        )
    return samples


def with_largest_groups(report: Inspection) -> Inspection:
    """The inspection with its dataset's largest groups; one that cannot be read (a damaged
    shard) is a problem the report names, not a crash."""
    try:
        return dataclasses.replace(report, groups=tuple(largest_group_samples(report.info)))
    except (tf.errors.OpError, OSError, ValueError) as failure:
        reason = tensorflow_reason(getattr(failure, "message", None) or str(failure))
        problem = f"the largest split groups could not be read: {type(failure).__name__}: {reason}"
        return dataclasses.replace(report, other_problems=(*report.other_problems, problem))

"""Checks shards against the manifest: existence, bytes, sha256 and record counts."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from collections.abc import Sequence

import tensorflow as tf

from tfdata_readers.manifest import ShardInfo, load_manifest

__all__ = ["ShardProblem", "verify", "main"]

_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class ShardProblem:
    """One mismatch between a shard file and its manifest entry."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _count_records(path: str) -> int:
    return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _check_shard(shard: ShardInfo) -> list[ShardProblem]:
    if not tf.io.gfile.exists(shard.path):
        return [ShardProblem(shard.path, "missing")]
    problems = []
    size = tf.io.gfile.stat(shard.path).length
    if size != shard.bytes:
        problems.append(ShardProblem(shard.path, f"{size} bytes, manifest says {shard.bytes}"))
    sha = _sha256(shard.path)
    if sha != shard.sha256:
        problems.append(ShardProblem(shard.path, f"sha256 {sha}, manifest says {shard.sha256}"))
    try:
        count = _count_records(shard.path)
    except tf.errors.OpError as e:
        problems.append(ShardProblem(shard.path, f"unreadable records: {e.message}"))
    else:
        if count != shard.num_examples:
            problems.append(ShardProblem(shard.path, f"{count} records, manifest says {shard.num_examples}"))
    return problems


def verify(data_dir: str | os.PathLike[str], splits: Sequence[str] | None = None) -> list[ShardProblem]:
    """Every problem found in the shards of `splits` (all splits by default); empty means all good."""
    info = load_manifest(data_dir)
    names = list(splits) if splits else sorted(info.splits)
    problems = []
    for name in names:
        for shard in info.split(name).shards:
            problems.extend(_check_shard(shard))
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfdata_readers.verify",
        description="Check a converted dataset's shards against its dataset_info.json.",
    )
    parser.add_argument("data_dir", help="directory (or gs:// URI) holding dataset_info.json")
    parser.add_argument("--split", action="append", help="split to check (repeatable); default: all")
    args = parser.parse_args(argv)
    problems = verify(args.data_dir, args.split)
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    info = load_manifest(args.data_dir)
    names = args.split or sorted(info.splits)
    total = sum(len(info.split(n).shards) for n in names)
    print(f"checked {total} shard(s) of split(s) {', '.join(names)}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

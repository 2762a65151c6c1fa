"""The stable hashes that place an input: its split fraction, its shard order and its bucket.

Each purpose has its own salt, so split and shard assignments are independent, and each depends
on the input's identity (its filename) alone: the same on every run, machine and runner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def _digest(purpose: str, filename: str) -> bytes:
    # Each purpose gets its own salt, so that split and shard assignments are independent.
    return hashlib.sha256(f"{purpose}\0{filename}".encode()).digest()


def stable_fraction(filename: str, purpose: str = "split") -> float:
    """A number in [0, 1) fixed by the filename alone: the same on every run, machine and runner."""
    return int.from_bytes(_digest(purpose, filename)[:8], "big") / 2**64


# Planning at cluster scale: each input's place follows from its own hash plus O(buckets) counts.
# The first 12 bits of the shard digest pick one of 4096 buckets per split; a bucket's offset is
# the number of inputs of its split in lower buckets, so offset + rank inside the bucket is the
# input's rank in the split's global hash order, as if the whole split had been sorted.
BUCKET_BITS = 12
NUM_BUCKETS = 1 << BUCKET_BITS


def shard_digest(filename: str) -> bytes:
    """The hash that orders a split's inputs (and so deals them to shards)."""
    return _digest("shard", filename)


def bucket_of(digest: bytes) -> int:
    """The hash-prefix bucket of a shard digest: buckets in ascending order follow the digests."""
    return int.from_bytes(digest[:2], "big") >> (16 - BUCKET_BITS)


def bucket_offsets(counts: Mapping[int, int]) -> dict[int, int]:
    """{bucket: number of inputs in lower buckets} for the buckets that hold any input."""
    offsets, total = {}, 0
    for bucket in sorted(counts):
        offsets[bucket] = total
        total += counts[bucket]
    return offsets

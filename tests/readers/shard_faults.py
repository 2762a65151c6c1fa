"""Injects faults into fixture datasets: flipped bytes, cut shards, rewritten records, edited manifests."""

from __future__ import annotations

import hashlib
import json
import pathlib
import struct
from collections.abc import Callable
from typing import Any

import tensorflow as tf

# TFRecord framing: 8-byte little-endian length, 4-byte CRC of it, the data, 4-byte CRC of the data.
LENGTH_BYTES = 8
HEADER_BYTES = 12


def record_offsets(path: pathlib.Path) -> list[tuple[int, int]]:
    """(byte offset, data length) of each record, read from the framing alone."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + LENGTH_BYTES])
        out.append((pos, length))
        pos += HEADER_BYTES + length + 4
    assert pos == len(data), f"{path} does not end on a record boundary"
    return out


def flip_byte(path: pathlib.Path, position: int) -> None:
    """Inverts one byte: same size, so only the CRCs can tell."""
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_record_byte(path: pathlib.Path, index: int, part: str) -> int:
    """Flips a byte of record `index`'s "length" or "data"; returns the record's byte offset."""
    offset, length = record_offsets(path)[index]
    flip_byte(path, offset + (1 if part == "length" else HEADER_BYTES + length // 2))
    return offset


def truncate(path: pathlib.Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def edit_manifest(data_dir: pathlib.Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((data_dir / "dataset_info.json").read_text())
    edit(manifest)
    (data_dir / "dataset_info.json").write_text(json.dumps(manifest))


def refresh_shard_entry(data_dir: pathlib.Path, file: str) -> None:
    """Makes the manifest's bytes and sha256 of `file` agree with the file (its count stays)."""
    data = (data_dir / file).read_bytes()

    def edit(manifest: dict[str, Any]) -> None:
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                if shard["file"] == file:
                    shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    edit_manifest(data_dir, edit)


def rewrite_record(data_dir: pathlib.Path, file: str, index: int, edit: Callable[[tf.train.Example], None]) -> None:
    """Replaces record `index` of `file` by an edited copy, with valid CRCs and a manifest that agrees."""
    path = data_dir / file
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    example = tf.train.Example.FromString(records[index])
    edit(example)
    records[index] = example.SerializeToString(deterministic=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    refresh_shard_entry(data_dir, file)

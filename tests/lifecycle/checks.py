"""What every lifecycle test checks after a kill or a change: one whole version, read whole."""

from __future__ import annotations

import collections
import json
import pathlib

import tensorflow as tf

import tfdata_readers as tfr
from tfdata_readers.checking.verification import verify

__all__ = ["examples_of_manifest", "examples_read", "manifest", "open_examples", "read_through", "verify_clean"]


def manifest(out: pathlib.Path | str) -> dict:
    return json.loads((pathlib.Path(out) / "dataset_info.json").read_text(encoding="utf-8"))


def examples_of_manifest(out: pathlib.Path | str, info: dict) -> collections.Counter:
    """(split, filename, label name) of every example the manifest's shards hold, read record by
    record from the files it lists (not through the reader under test)."""
    names = info["label_names"]
    found: collections.Counter = collections.Counter()
    spec = {
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }
    for split, facts in info["splits"].items():
        for shard in facts["shards"]:
            for record in tf.data.TFRecordDataset(str(pathlib.Path(out) / shard["file"])):
                example = tf.io.parse_single_example(record, spec)
                label = int(example["image/class/label"])
                assert 0 <= label < len(names), f"label {label} outside the {len(names)} classes"
                found[(split, example["image/filename"].numpy().decode(), names[label])] += 1
    return found


def open_examples(out: pathlib.Path | str, **kwargs) -> dict:
    """Reader datasets built now, one per split (iterated later by read_through): a trainer that
    opened the dataset at this moment."""
    info = tfr.load_manifest(str(out), **kwargs)
    return {
        "info": info,
        "datasets": {
            split: tfr.make_dataset(str(out), split, 8, with_metadata=True, **kwargs) for split in info.splits
        },
    }


def read_through(opened: dict) -> collections.Counter:
    """(split, filename, label name) of every example the opened datasets yield in one epoch."""
    names = opened["info"].label_names
    found: collections.Counter = collections.Counter()
    for split, dataset in opened["datasets"].items():
        for _, labels, metadata in dataset:
            for label, filename in zip(labels.numpy(), metadata["filename"].numpy(), strict=True):
                assert 0 <= label < len(names), f"label {label} outside the {len(names)} classes"
                found[(split, filename.decode(), names[label])] += 1
    return found


def examples_read(out: pathlib.Path | str, **kwargs) -> collections.Counter:
    return read_through(open_examples(out, **kwargs))


def verify_clean(out: pathlib.Path | str) -> None:
    problems = verify(str(out))
    assert problems == [], problems

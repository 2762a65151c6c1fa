"""A tf.data reader for the TFRecord image shards (and dataset_info.json) written by the conversion job."""

from __future__ import annotations

# First: the command lines import TensorFlow with its start-up noise kept off the terminal.
from tfdata_readers._quiet_start import quiet_for_command_lines

quiet_for_command_lines()

from tfdata_readers.classes import class_counts  # noqa: E402
from tfdata_readers.config import ReadConfig
from tfdata_readers.distribute import distribute
from tfdata_readers.files import ShardError
from tfdata_readers.manifest import (
    DatasetInfo,
    VersionNotFoundError,
    current_version,
    load_manifest,
    num_examples,
    steps_per_epoch,
)
from tfdata_readers.pipeline import make_dataset
from tfdata_readers.records import reset_skipped_records, skipped_records
from tfdata_readers.verification import ShardProblem, verify

__all__ = [
    "DatasetInfo",
    "ReadConfig",
    "ShardError",
    "ShardProblem",
    "VersionNotFoundError",
    "class_counts",
    "current_version",
    "distribute",
    "load_manifest",
    "make_dataset",
    "num_examples",
    "reset_skipped_records",
    "skipped_records",
    "steps_per_epoch",
    "verify",
]

"""A tf.data reader for the TFRecord image shards (and dataset_info.json) written by the conversion job.

    import tfdata_readers as tr
    info = tr.load_manifest("tfrecords/")
    train = tr.make_dataset("tfrecords/", tr.ReadConfig(split="train", batch_size=64, training=True))

Each name below is imported from its module when first used (PEP 562), so ``import tfdata_readers``
and the command lines' ``--help`` do not pay TensorFlow's import (seconds) until something needs it.
TensorFlow is the ``[read]`` extra: a name that needs it, without it installed, says how to get it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tfdata_readers._quiet_start import MISSING_TENSORFLOW

if TYPE_CHECKING:
    from tfdata_readers.checking.verification import ShardProblem, verify
    from tfdata_readers.config import ReadConfig
    from tfdata_readers.distribute import distribute
    from tfdata_readers.pipeline import make_dataset
    from tfdata_readers.sources.classes import class_counts
    from tfdata_readers.sources.files import ShardError
    from tfdata_readers.sources.manifest import (
        DatasetInfo,
        VersionNotFoundError,
        current_version,
        load_manifest,
        num_examples,
        steps_per_epoch,
    )
    from tfdata_readers.sources.records import reset_skipped_records, skipped_records
    from tfdata_readers.sources.storage import s3_store

_HOMES = {
    "class_counts": "sources.classes",
    "ReadConfig": "config",
    "distribute": "distribute",
    "ShardError": "sources.files",
    "DatasetInfo": "sources.manifest",
    "VersionNotFoundError": "sources.manifest",
    "current_version": "sources.manifest",
    "load_manifest": "sources.manifest",
    "num_examples": "sources.manifest",
    "steps_per_epoch": "sources.manifest",
    "make_dataset": "pipeline",
    "reset_skipped_records": "sources.records",
    "skipped_records": "sources.records",
    "s3_store": "sources.storage",
    "ShardProblem": "checking.verification",
    "verify": "checking.verification",
}

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
    "s3_store",
    "skipped_records",
    "steps_per_epoch",
    "verify",
]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tfdata_readers' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"tfdata_readers.{home}")
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise ModuleNotFoundError(f"tfdata_readers.{name} {MISSING_TENSORFLOW}", name="tensorflow") from None
    value = getattr(module, name)
    globals()[name] = value  # Once imported, an ordinary attribute.
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

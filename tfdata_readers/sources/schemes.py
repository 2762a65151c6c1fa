"""Which storage schemes the reader can open, refused up front when it cannot.

The reader opens files with TensorFlow's own filesystems (`tf.io.gfile`, `TFRecordDataset`). In
TensorFlow 2.21 those are local paths (and `file://`), `gs://` and `ram://`; there is no `s3://`
(it moved to tensorflow-io, whose plugins stop at older TensorFlow versions). Every reader entry
point reads `s3://` all the same, without TensorFlow: the manifest and small files through boto3
(storage.py), the shards through a verified local cache (shard_cache.py) or, for `verify` and
`inspect`, a temporary download. Any other scheme TensorFlow lacks fails at once, naming what it
reads, never deep inside a file call.
"""

from __future__ import annotations

import os

import tensorflow as tf

from tfdata_readers.sources import storage

__all__ = ["check_readable_location"]


def _registered_schemes() -> set[str]:
    # Private, but the only place TensorFlow lists its filesystems; if it moves, the reader falls
    # back to TensorFlow's own error for unknown schemes.
    try:
        from tensorflow.python.lib.io import file_io  # pylint: disable=import-outside-toplevel

        return set(file_io.get_registered_schemes())
    except (ImportError, AttributeError):
        return set()


def check_readable_location(data_dir: str | os.PathLike[str]) -> None:
    """Raises ValueError naming what the reader reads when it cannot open ``data_dir``.

    Local paths, s3:// (and its s3a://, s3n:// spellings), and every scheme TensorFlow has
    registered (gs://, file://, ram://) pass.
    """
    path = os.fspath(data_dir)
    scheme, sep, _ = path.partition("://")
    if not sep or storage.is_s3(path):
        return
    scheme = scheme.lower()
    registered = _registered_schemes()
    if registered and scheme not in registered:
        readable = ", ".join(f"{s}://" for s in sorted(registered | {"s3"}) if s) + " and local paths"
        raise ValueError(
            f"cannot read {path}: TensorFlow {tf.__version__} has no {scheme}:// filesystem (the reader reads "
            f"{readable}); copy the dataset to one of those, or mount it as a local folder"
        )

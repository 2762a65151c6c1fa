"""Which storage schemes the reader can open, refused up front with the alternatives when it cannot.

The reader opens files with TensorFlow's own filesystems (`tf.io.gfile`, `TFRecordDataset`). In
TensorFlow 2.21 those are local paths (and `file://`), `gs://` and `ram://`; there is no `s3://`
(it moved to tensorflow-io, whose plugins stop at older TensorFlow versions). `make_dataset`,
`steps_per_epoch` and `class_counts` read `s3://` all the same: the manifest through boto3
(storage.py) and the shards through a verified local cache (shard_cache.py). What does not read
it yet (`verify`, `inspect`) fails at once with what to do instead, never deep inside a file call.
"""

from __future__ import annotations

import os

import tensorflow as tf

__all__ = ["check_readable_location"]

_ALTERNATIVES = (
    "copy the dataset to local disk first (e.g. `aws s3 sync {path} DIR`, then read DIR), mount the "
    "bucket as a folder (mountpoint-s3, s3fs) and read the mount, or write the dataset to gs:// or "
    "local/shared storage instead (the conversion job writes to any of them)"
)
# Schemes with no filesystem in TensorFlow whose data people still point the reader at.
_S3_LIKE = frozenset({"s3", "s3a", "s3n"})


def _registered_schemes() -> set[str]:
    # Private, but the only place TensorFlow lists its filesystems; if it moves, the reader falls
    # back to TensorFlow's own error for unknown schemes.
    try:
        from tensorflow.python.lib.io import file_io  # pylint: disable=import-outside-toplevel

        return set(file_io.get_registered_schemes())
    except (ImportError, AttributeError):
        return set()


def check_readable_location(data_dir: str | os.PathLike[str], *, through_cache: bool = False) -> None:
    """Raises ValueError naming the alternatives when the reader cannot open ``data_dir``.

    Local paths and every scheme TensorFlow has registered (gs://, file://, ram://) pass, and
    s3:// too with ``through_cache`` (a caller that reads its shards through the cache).
    """
    path = os.fspath(data_dir)
    scheme, sep, _ = path.partition("://")
    if not sep:
        return
    scheme = scheme.lower()
    if scheme in _S3_LIKE and through_cache:
        return
    if scheme in _S3_LIKE:
        raise ValueError(
            f"cannot read {path}: TensorFlow {tf.__version__} has no {scheme}:// filesystem (tensorflow-io's, "
            f"which had one, does not support this TensorFlow), and this command does not yet read it through "
            f"the reader's cache (make_dataset does, with ReadConfig.cache_dir); {_ALTERNATIVES.format(path=path)}"
        )
    registered = _registered_schemes()
    if registered and scheme not in registered:
        readable = ", ".join(f"{s}://" for s in sorted(registered) if s) + " and local paths"
        raise ValueError(
            f"cannot read {path}: TensorFlow {tf.__version__} has no {scheme}:// filesystem (it reads "
            f"{readable}); copy the dataset to one of those, or mount it as a local folder"
        )

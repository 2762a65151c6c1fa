"""The feature spec of the on-disk format and a vectorised parse of a batch of serialized Examples."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["FEATURE_DTYPES", "METADATA_KEYS", "feature_spec", "parse_batch"]

# Keys and dtypes from docs/FORMAT.md; the manifest's `features` may restate them.
FEATURE_DTYPES: dict[str, tf.DType] = {
    "image/encoded": tf.string,
    "image/format": tf.string,
    "image/height": tf.int64,
    "image/width": tf.int64,
    "image/channels": tf.int64,
    "image/class/label": tf.int64,
    "image/class/text": tf.string,
    "image/filename": tf.string,
    "image/key/sha256": tf.string,
    "image/source_id": tf.string,
}
_MANIFEST_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
# Output name -> feature key, for `with_metadata=True`.
METADATA_KEYS: dict[str, str] = {
    "filename": "image/filename",
    "key": "image/key/sha256",
    "source_id": "image/source_id",
    "label_text": "image/class/text",
}


def feature_spec(keys: list[str], declared: dict[str, dict[str, Any]] | None = None) -> dict[str, tf.io.FixedLenFeature]:
    """FixedLenFeature([]) for each key; a dtype the manifest declares must agree with the format."""
    spec = {}
    for key in keys:
        dtype = FEATURE_DTYPES[key]
        if declared and key in declared and "dtype" in declared[key]:
            named = declared[key]["dtype"]
            if _MANIFEST_DTYPES.get(named) != dtype:
                raise ValueError(
                    f"manifest declares feature {key!r} as {named!r}; this reader expects {dtype.name}"
                )
        spec[key] = tf.io.FixedLenFeature([], dtype)
    return spec


def parse_batch(serialized: tf.Tensor, spec: dict[str, tf.io.FixedLenFeature]) -> dict[str, tf.Tensor]:
    """Parses a [B] string tensor of Examples in one op (much cheaper than B single parses)."""
    return tf.io.parse_example(serialized, spec)

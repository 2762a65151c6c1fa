"""The feature spec of the on-disk format, checked against the manifest, and parsing of serialized Examples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from google.protobuf import message

__all__ = [
    "FEATURE_DTYPES",
    "METADATA_KEYS",
    "check_declared_features",
    "feature_spec",
    "list_feature_spec",
    "parse_batch",
    "record_problem",
]

# Keys and dtypes from docs/FORMAT.md; the manifest's `features` restates them.
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
_DTYPE_NAMES = {dtype: name for name, dtype in _MANIFEST_DTYPES.items()}
# The tf.train.Feature list that holds each dtype.
_KINDS = {tf.string: "bytes_list", tf.int64: "int64_list", tf.float32: "float_list"}
# The lists of an annotated dataset (its manifest's `task`: "multi_label" or "detection"),
# declared with shape [null]: the keys TensorFlow Model Garden's decoders read.
LIST_DTYPES: dict[str, tf.DType] = {
    "image/class/label": tf.int64,
    "image/object/bbox/xmin": tf.float32,
    "image/object/bbox/ymin": tf.float32,
    "image/object/bbox/xmax": tf.float32,
    "image/object/bbox/ymax": tf.float32,
    "image/object/class/label": tf.int64,
    "image/object/is_crowd": tf.int64,
    "image/object/mask": tf.string,  # a PNG per object, with instance masks
}
# Output name -> feature key, for `with_metadata=True`.
METADATA_KEYS: dict[str, str] = {
    "filename": "image/filename",
    "key": "image/key/sha256",
    "source_id": "image/source_id",
    "label_text": "image/class/text",
}


def check_declared_features(keys: list[str], declared: Mapping[str, Any] | None) -> list[str]:
    """Every disagreement between the manifest's `features` and the format, for `keys`; [] if none.

    Each of `keys` must be declared, as a scalar of the format's dtype: nothing is converted. The
    conversion job always declares them; a manifest that declares none (hand-written, or from
    another tool) is refused rather than trusted. `declared=None` (no manifest) checks nothing.
    """
    if declared is None:
        return []
    problems = []
    for key in keys:
        expected = _DTYPE_NAMES[FEATURE_DTYPES[key]]
        entry = declared.get(key)
        if not isinstance(entry, Mapping):
            problems.append(
                f"does not declare feature {key!r}, which this reader needs as {expected!r}; "
                f"it declares {sorted(declared)}"
            )
        elif entry.get("dtype") != expected:
            problems.append(
                f"declares feature {key!r} as dtype {entry.get('dtype')!r}; this reader expects "
                f"{expected!r} and converts nothing"
            )
        elif entry.get("shape", []) != []:
            problems.append(f"declares feature {key!r} with shape {entry['shape']!r}; expected [] (a scalar)")
    return problems


def feature_spec(
    keys: list[str], declared: Mapping[str, Any] | None = None, *, where: str = "the manifest"
) -> dict[str, tf.io.FixedLenFeature]:
    """FixedLenFeature([]) for each key; fails naming the key and dtypes if the manifest disagrees."""
    problems = check_declared_features(keys, declared)
    if problems:
        raise ValueError(f"{where} " + "; it ".join(problems))
    return {key: tf.io.FixedLenFeature([], FEATURE_DTYPES[key]) for key in keys}


def list_feature_spec(
    keys: list[str], declared: Mapping[str, Any], *, where: str = "the manifest"
) -> dict[str, tf.io.RaggedFeature]:
    """RaggedFeature for each list key; fails naming the key if the manifest does not declare it
    as a list ([null]) of the expected dtype."""
    problems = []
    for key in keys:
        entry = declared.get(key)
        expected = _DTYPE_NAMES[LIST_DTYPES[key]]
        if not isinstance(entry, Mapping) or entry.get("dtype") != expected or entry.get("shape") != [None]:
            problems.append(f"declares feature {key!r} as {entry!r}; this reader needs a list of {expected!r}")
    if problems:
        raise ValueError(f"{where} " + "; it ".join(problems))
    return {key: tf.io.RaggedFeature(LIST_DTYPES[key], row_splits_dtype=tf.int64) for key in keys}


def parse_batch(
    serialized: tf.Tensor, spec: dict[str, tf.io.FixedLenFeature], *, names: tf.Tensor | None = None
) -> dict[str, tf.Tensor]:
    """Parses a [B] string tensor of Examples in one op (much cheaper than B single parses).

    `names` ([B] strings) only label the records in TensorFlow's parse errors, which otherwise
    say "Name: <unknown>"; a missing key or a wrong type is an error, never converted.
    """
    return tf.io.parse_example(serialized, spec, example_names=names)


def record_problem(record: bytes, spec: Mapping[str, tf.io.FixedLenFeature]) -> str:
    """Why one serialized record does not parse with `spec` ("" if it does), in plain Python.

    `verify` uses it to say which key of which record is wrong without running a pipeline.
    """
    try:
        example = tf.train.Example.FromString(record)
    except message.DecodeError as e:
        return f"is not a serialized tf.train.Example ({e})"
    features = example.features.feature
    for key, wanted in spec.items():
        expected = _DTYPE_NAMES[wanted.dtype]
        if key not in features:
            return f"lacks feature {key} ({expected})"
        kind = features[key].WhichOneof("kind")
        if kind != _KINDS[wanted.dtype]:
            held = {v: _DTYPE_NAMES[k] for k, v in _KINDS.items()}.get(kind, "nothing")
            return f"has feature {key} as {held}; expected {expected}"
        values = len(getattr(features[key], kind).value)
        if values != 1:
            return f"has {values} values in feature {key}; expected 1 {expected}"
    return ""

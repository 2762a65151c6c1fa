"""verify-tfrecords --leakage: the near-copy pairs whose two examples are in different splits, and
the user groups (a ``group`` column's value, a --group_pattern capture) whose examples are.

Each example's perceptual signature (docs/FORMAT.md, ``image/near_copy/signature``: 2 bytes of
tone, a 64-bit DCT hash of the source in grey, then 8 bytes of its quadrants' chromaticity; a
dataset made with the legacy method stored the last 16 bytes alone) is read from the example
where the job stored it. A dataset made without ``--split_groups near_copies`` has none:
the signature is then computed here, with TensorFlow's ops, from the stored image (the job
computed its own from the source, before any crop or resize, with Pillow: the two agree on what
is a near-copy, not bit for bit, so an older dataset's report is an estimate).

Pairs are found as the job finds them, without comparing all pairs (two hashes at most ``t`` bits
apart agree on one of ``t + 1`` bands), written here in numpy over sorted band values: this
package does not import the job's.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from tfdata_readers.sources.manifest import read_shard_sidecar
from tfdata_readers.sources.manifest_types import DatasetInfo
from tfdata_readers.sources.records import tensorflow_reason

__all__ = [
    "DEFAULT_BITS",
    "DEFAULT_CHROMA_STEP",
    "LeakageNotChecked",
    "cross_split_pairs",
    "leakage_command_lines",
    "user_groups_across_splits",
]

SIGNATURE_KEY = "image/near_copy/signature"
DEFAULT_BITS = 14  # the job's default --near_copy_bits
DEFAULT_CHROMA_STEP = 13  # the job's MAX_CHROMA_STEP
_SIDE = 32
_CHROMA_OFFSET = 16.0  # added to each channel's mean, as the job does
# The tone bytes, as the job makes them: the grey levels' mean and log(std + 2) in steps of 0.025,
# and how far they may differ between near-copies (the job's MAX_TONE_STEPS).
_TONE_STEP = 0.025
_STD_OFFSET = 2.0
DEFAULT_TONE_STEPS = (30, 16)
SIGNATURE_BYTES = 18


class LeakageNotChecked(ValueError):
    """The examples could not all be read (a missing or damaged shard), so no pair is claimed either way."""


def _dct_rows() -> tf.Tensor:
    k = np.arange(8)[:, None]
    i = np.arange(_SIDE)[None, :]
    return tf.constant(np.cos(np.pi * (2 * i + 1) * k / (2 * _SIDE)), dtype=tf.float32)


def _signature_of_image(encoded: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """18 bytes: the tone, the grey DCT hash and the chromaticity, of a stored image (JPEG, PNG)."""
    pixels = tf.cast(tf.image.decode_image(encoded, channels=3, expand_animations=False), tf.float32)
    small = tf.image.resize(pixels, (_SIDE, _SIDE), method="area")
    grey = tf.squeeze(tf.image.rgb_to_grayscale(small), -1)
    frequencies = tf.reshape(rows @ grey @ tf.transpose(rows), [-1])
    median = tf.sort(frequencies)[31:33]
    bits = tf.cast(frequencies > tf.reduce_mean(median), tf.uint8)  # numpy's median of 64: the middle two
    quadrants = tf.reduce_mean(tf.reshape(small, (2, _SIDE // 2, 2, _SIDE // 2, 3)), axis=(1, 3)) + _CHROMA_OFFSET
    chromaticity = quadrants[:, :, :2] / tf.reduce_sum(quadrants, axis=2, keepdims=True)
    chroma = tf.cast(tf.round(tf.reshape(chromaticity, [-1]) * 255), tf.uint8)
    packed = tf.reduce_sum(tf.reshape(bits, (8, 8)) * tf.constant([128, 64, 32, 16, 8, 4, 2, 1], tf.uint8), axis=1)
    levels = tf.stack([tf.reduce_mean(grey), tf.math.log(tf.math.reduce_std(grey) + _STD_OFFSET) / _TONE_STEP])
    tone = tf.cast(tf.clip_by_value(tf.round(levels), 1, 255), tf.uint8)
    return tf.concat([tone, packed, chroma], axis=0)


def _signatures(info: DatasetInfo, split: str, stored: bool) -> Iterator[tuple[str, bytes | None, bool]]:
    """(filename, 18 signature bytes or None, whether estimated) of every example of ``split``: a
    legacy signature's 16 bytes get two zero tone bytes, which compare as equal to any. An example
    whose source gave the job no signature (stored empty) gets an estimate of its stored image,
    so that no example is left out of the check unseen."""
    spec = {
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
    }
    if stored:
        spec[SIGNATURE_KEY] = tf.io.FixedLenFeature([], tf.string)
    rows = _dct_rows()
    files = [shard.path for shard in info.split(split).shards]
    records = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    if not stored:
        records = records.map(
            lambda e: {"image/filename": e["image/filename"], "bytes": _signature_of_image(e["image/encoded"], rows)},
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    for example in records.as_numpy_iterator():
        name = example["image/filename"].decode("utf-8", "replace")
        estimated = not stored
        value = example[SIGNATURE_KEY] if stored else example["bytes"].tobytes()
        if stored and len(value) == 0:
            estimated = True
            try:
                value = _signature_of_image(tf.constant(example["image/encoded"]), rows).numpy().tobytes()
            except tf.errors.InvalidArgumentError:  # a stored image TensorFlow cannot decode: no signature
                value = b""
        if len(value) == 16:
            value = bytes(2) + bytes(value)
        yield name, (bytes(value) if len(value) == SIGNATURE_BYTES else None), estimated


def cross_split_pairs(
    names: list[str],
    splits: list[str],
    signatures: np.ndarray,
    *,
    bits: int,
    chroma_step: int,
    tone_steps: tuple[int, int] | None = DEFAULT_TONE_STEPS,
) -> list[tuple[int, int, int]]:
    """(i, j, grey distance) of the near-copy pairs (``signatures``: N x 18 uint8 rows) whose
    examples are in different splits, i < j, each pair once. ``tone_steps`` None: without the
    tone (a dataset made with the legacy method); a signature without tone bytes passes it."""
    tone = signatures[:, :2].astype(np.int16)
    grey = signatures[:, 2:10].copy().view(">u8").ravel().astype(np.uint64)
    chroma = signatures[:, 10:].astype(np.int16)
    toneless = (tone == 0).all(axis=1)
    steps = np.array(tone_steps if tone_steps is not None else (255, 255))
    split_ids = np.unique(np.array(splits), return_inverse=True)[1]
    found: set[tuple[int, int, int]] = set()
    count = bits + 1
    widths = [64 // count + (1 if index < 64 % count else 0) for index in range(count)]
    shift = 0
    for width in widths:
        values = (grey >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        shift += width
        order = np.argsort(values, kind="stable")
        boundaries = np.flatnonzero(np.diff(values[order])) + 1
        for run in np.split(order, boundaries):
            if len(run) < 2:
                continue
            for position, i in enumerate(run[:-1]):
                others = run[position + 1 :]
                distances = np.bitwise_count(grey[others] ^ grey[i])
                near = (
                    (distances <= bits)
                    & (np.abs(chroma[others] - chroma[i]).max(axis=1) <= chroma_step)
                    & (split_ids[others] != split_ids[i])
                    & ((np.abs(tone[others] - tone[i]) <= steps).all(axis=1) | toneless[others] | toneless[i])
                )
                for j, distance in zip(others[near], distances[near], strict=True):
                    found.add((min(int(i), int(j)), max(int(i), int(j)), int(distance)))
    return sorted(found)


def user_groups_across_splits(info: DatasetInfo) -> tuple[dict[str, dict[str, list[str]]], int]:
    """({user group: {split: [example names]}} of the user groups whose examples are in two or more
    splits, and how many shards' sidecars could not be read), from the sidecars, which record
    each example's user group (``input_user_groups``); the examples do not store it."""
    members: dict[str, dict[str, list[str]]] = {}
    unread = 0
    for split in sorted(info.splits):
        for shard in info.split(split).shards:
            sidecar = read_shard_sidecar(shard.path) or {}
            names, groups = sidecar.get("input_filenames"), sidecar.get("input_user_groups")
            if not isinstance(names, list):
                unread += 1
                continue
            for name, group in zip(names, groups or [], strict=False):
                if group is not None:
                    members.setdefault(str(group), {}).setdefault(split, []).append(str(name))
    return {group: splits for group, splits in sorted(members.items()) if len(splits) > 1}, unread


def leakage_command_lines(info: DatasetInfo, *, bits: int | None = None, shown: int = 10) -> tuple[int, list[str]]:
    """(pairs across splits, the lines the command prints) for the dataset ``info`` describes, at
    ``bits`` (None: the threshold the dataset was made with, else DEFAULT_BITS)."""
    groups = info.raw.get("split_groups") or {}
    recorded = groups.get("near_copy_bits")  # 0 is a threshold: only identical hashes
    if bits is None:
        bits = DEFAULT_BITS if recorded is None else int(recorded)
    # null: a dataset stored in grey, compared by the grey hash alone (any colour difference passes)
    step = groups.get("max_chroma_step", DEFAULT_CHROMA_STEP)
    chroma_step = 255 if step is None else int(step)
    # absent: a dataset made with the legacy method (or without groups, estimated with the tone)
    tones = groups.get("max_tone_steps", None if groups.get("method") else DEFAULT_TONE_STEPS)
    tone_steps = None if tones is None else (int(tones[0]), int(tones[1]))
    stored = SIGNATURE_KEY in (info.features or {})
    names, splits, rows = [], [], []
    unsigned = estimated = 0
    for split in sorted(info.splits):
        try:
            for name, signature, guessed in _signatures(info, split, stored):
                if signature is None:
                    unsigned += 1
                    continue
                estimated += guessed and stored
                names.append(name)
                splits.append(split)
                rows.append(np.frombuffer(signature, dtype=np.uint8))
        except tf.errors.OpError as failure:  # a missing or damaged shard: the check is refused, in one line
            reason = tensorflow_reason(failure.message or str(failure))
            raise LeakageNotChecked(
                f"leakage not checked: the examples of split {split!r} cannot all be read "
                f"({type(failure).__name__}: {reason})"
            ) from None
    table = np.stack(rows) if rows else np.zeros((0, SIGNATURE_BYTES), np.uint8)
    pairs = cross_split_pairs(names, splits, table, bits=bits, chroma_step=chroma_step, tone_steps=tone_steps)
    source = "the signatures stored in its examples" if stored else "signatures of the stored images (an estimate)"
    lines = [
        f"leakage: {len(pairs)} near-copy pair(s) across splits among {len(names)} example(s), by {source}, "
        f"at {bits} bits"
        + (
            f"; {estimated} example(s) whose source gave no signature, by signatures of their stored images"
            if estimated
            else ""
        )
        + (f"; {unsigned} example(s) without a signature" if unsigned else "")
    ]
    for i, j, distance in pairs[:shown]:
        lines.append(f"LEAK {splits[i]}/{names[i]} ~ {splits[j]}/{names[j]} ({distance} bits)")
    if len(pairs) > shown:
        lines.append(f"... and {len(pairs) - shown} more")
    spanning, unread = user_groups_across_splits(info)
    lines.append(
        f"leakage: {len(spanning)} user group(s) across splits, by the shards' sidecars"
        + (f" ({unread} shard(s) without a readable sidecar not checked)" if unread else "")
    )
    for group, by_split in list(spanning.items())[:shown]:
        examples = "; ".join(f"{split}: {', '.join(sorted(names)[:3])}" for split, names in sorted(by_split.items()))
        lines.append(f"LEAK group {group!r} spans {', '.join(sorted(by_split))} ({examples})")
    if len(spanning) > shown:
        lines.append(f"... and {len(spanning) - shown} more")
    return len(pairs) + len(spanning), lines

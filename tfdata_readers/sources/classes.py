"""Per-class example counts from `dataset_info.json`, for class weights and imbalance checks."""

from __future__ import annotations

import os

from tfdata_readers.sources.manifest import load_manifest

__all__ = ["class_counts"]


def class_counts(data_dir: str | os.PathLike[str], split: str, *, version: int | None = None) -> dict[int, int]:
    """`{label id: examples}` of `split` of `version` (None: the current one), for every class (0
    for a class the split lacks).

    Keyed by label id (the index into `label_names`, the value of `image/class/label`), so it
    plugs straight into Keras's `class_weight`, e.g. balanced weights::

        counts = tfr.class_counts(data_dir, "train")
        total, k = sum(counts.values()), len(counts)
        class_weight = {i: total / (k * n) for i, n in counts.items() if n}

    The counts come from the manifest, which the conversion job fills in the same pass that
    writes the shards, so this reads no shard. A manifest written before the job recorded them
    is refused with an error that says so (everything else in the reader still reads it).
    """
    info = load_manifest(data_dir, version)
    split_info = info.split(split)
    raw = info.raw["splits"][split].get("class_counts")
    path = info.manifest_path
    if raw is None:
        raise ValueError(
            f"{path} has no class_counts for split {split!r}: it was written by a version of "
            f"images-to-tfrecords that did not record them; rerun the conversion (--resume keeps the "
            f"shards it can) to add them"
        )
    if (
        not isinstance(raw, dict)
        or set(raw) != set(info.label_names)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in raw.values())
    ):
        raise ValueError(
            f"{path}: split {split!r} class_counts must give a count >= 0 for each of label_names "
            f"{list(info.label_names)} (got {raw!r})"
        )
    # A one-label example counts for one class; an annotated one for each class it shows.
    if info.task == "classification" and sum(raw.values()) != split_info.num_examples:
        raise ValueError(
            f"{path}: split {split!r} class_counts add up to {sum(raw.values())} but num_examples is "
            f"{split_info.num_examples}"
        )
    return {index: raw[name] for index, name in enumerate(info.label_names)}

"""dataset_info.json's content, pure: the splits, classes and shards a run wrote, its settings and
their fingerprint, and the features and format version a reader needs."""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import beam_jobs
from beam_jobs.config import ImageConfig
from beam_jobs.imaging.example import (
    FEATURE_DTYPES,
    INSTANCE_MASK_DTYPES,
    LIST_FEATURE_DTYPES,
    NEAR_COPY_KEY,
    SEMANTIC_MASK_DTYPES,
)
from beam_jobs.imaging.masks import PAD_CLASS
from beam_jobs.imaging.resample import LEGACY_RESAMPLE
from beam_jobs.records import ShardResult
from beam_jobs.writing.dead_letter_files import DEAD_LETTERS_FILE
from beam_jobs.writing.duplicates import conflicting_label_warnings
from beam_jobs.writing.run_folders import run_prefix

__all__ = [
    "ANNOTATED_SCHEMA_VERSION",
    "PRODUCER",
    "SCHEMA_VERSION",
    "applied_settings",
    "build_dataset_info",
    "feature_declarations",
    "run_fingerprint",
]

# The manifest's format: 1 for one-label datasets of one image size, as every release wrote them;
# 2 where each image keeps its own size (image height and width null) or examples hold lists
# (annotated). A dataset is written with the lowest version that describes it, so the readers of
# earlier releases still read what they can, and refuse what they would misread.
SCHEMA_VERSION = 1
ANNOTATED_SCHEMA_VERSION = 2
PRODUCER = "images-to-tfrecords"


def run_fingerprint(config: ImageConfig, settings: dict) -> str:
    """Identifies a run's output-shaping settings: two runs with equal fingerprints write the same
    dataset from the same inputs, so their files may be reused (--resume) but never mixed otherwise."""
    config_json = config.to_json()
    if config_json["resample"] == LEGACY_RESAMPLE:
        # The only resampling before --resample existed, byte for byte: a dataset made then has the
        # fingerprint of --resample bicubic now, so it can be resumed or appended to with it.
        del config_json["resample"]
    # Schema 1 always: the settings (resize_mode keep) and the shards' inputs (annotations) already
    # tell a version-2 dataset apart, and the fingerprints of earlier runs must not change.
    text = json.dumps({"config": config_json, "settings": settings, "schema": SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def build_dataset_info(
    summary: dict,
    results: Iterable[ShardResult],
    *,
    num_dead_letters: int,
    config: ImageConfig,
    settings: dict,
    content_duplicates: Sequence[dict] = (),
    dead_letters_by_reason: dict[str, int] | None = None,
    run: str | None = None,
) -> dict:
    """dataset_info.json, as a plain dict: pure, so that its content is testable and deterministic.

    Shard files and the dead letters are named relative to the output folder, in the folder of
    ``run`` (run_folders.py); None names them directly in it, as releases before versioned
    datasets wrote them. The commit adds the version keys (commit.py)."""
    prefix = "" if run is None else run_prefix(run) + "/"
    by_split: dict[str, list[ShardResult]] = {}
    for result in sorted(results):
        by_split.setdefault(result.split, []).append(result)
    label_names = list(summary["label_names"])
    splits = {split: _split_facts(shards, label_names, prefix) for split, shards in sorted(by_split.items())}
    annotated = bool(summary.get("annotated"))
    if annotated:
        for split, shards in sorted(by_split.items()):
            splits[split].update(_annotated_split_facts(shards, label_names, summary.get("annotation_kinds", ())))
    info = {
        "schema_version": ANNOTATED_SCHEMA_VERSION if annotated or config.keeps_size else SCHEMA_VERSION,
        "producer": {"name": PRODUCER, "version": beam_jobs.__version__},
        "label_names": label_names,
        "num_classes": len(summary["label_names"]),
        # Labels kept at their ids with no example (with_label_map): no other label ever takes them.
        **({"retired_labels": list(summary["retired_labels"])} if summary.get("retired_labels") else {}),
        "image": {
            "height": None if config.keeps_size else config.height,
            "width": None if config.keeps_size else config.width,
            "channels": config.channels,
            "format": config.format_name,
        },
        "features": feature_declarations(
            annotated,
            summary.get("annotation_kinds", ()),
            near_copies=bool((summary.get("split_groups") or {}).get("method")),
        ),
        "preprocessing": {**config.to_json(), **applied_settings(settings, summary)},
        "splits": splits,
        # What the plan found worth a warning (merged split folders, classes missing from a split,
        # --splits that no input took); the console showed them under the plan line.
        "warnings": [
            *summary.get("warnings", []),
            *_emptied_class_warnings(summary, splits),
            *conflicting_label_warnings(content_duplicates),
        ],
        "num_inputs": summary["num_inputs"],
        "num_dead_letters": num_dead_letters,
        # Per reason; duplicate_input and duplicate_content were dropped on purpose (--dedup).
        "dead_letters_by_reason": dict(sorted((dead_letters_by_reason or {}).items())),
        "dead_letters_file": prefix + DEAD_LETTERS_FILE,
        "fingerprint": run_fingerprint(config, settings),
        # Examples whose source bytes are identical (kept: --dedup=path); --dedup=content drops them.
        "content_duplicates": list(content_duplicates),
        # --split_groups and group columns: how groups were found, the largest, and the near-copy
        # pairs across splits (none unless the user gave the two splits).
        **({"split_groups": summary["split_groups"]} if summary.get("split_groups") else {}),
    }
    if annotated:
        info.update(_annotation_facts(summary, label_names))
    return info


def _split_facts(shards: list[ShardResult], label_names: list[str], prefix: str) -> dict:
    """One split's entry: its examples, per class and in all, its dead letters and its shards."""
    classes: collections.Counter[str] = collections.Counter({name: 0 for name in label_names})
    reasons: collections.Counter[str] = collections.Counter()
    for s in shards:
        classes.update(dict(s.class_counts))
        reasons.update(dict(s.dead_letters_by_reason))
    return {
        "num_examples": sum(s.num_examples for s in shards),
        "num_shards": len(shards),
        # Every label, zeros included, so an empty class shows; counted from the examples
        # written (not the plan), so they add up to num_examples.
        "class_counts": {name: classes[name] for name in label_names},
        # Dead letters of the conversion of this split's shards; those of the listing and
        # planning have no split and are only in the dataset-wide dead_letters_by_reason.
        "dead_letters_by_reason": dict(sorted(reasons.items())),
        "shards": [
            {"file": prefix + s.file, "num_examples": s.num_examples, "bytes": s.bytes, "sha256": s.sha256}
            for s in shards
        ],
    }


def _annotated_split_facts(shards: list[ShardResult], label_names: list[str], kinds: Sequence[str]) -> dict:
    """What an annotated split's entry adds: its objects per class, those the crop cut away and,
    with semantic masks, the class ids they hold."""
    objects: collections.Counter[str] = collections.Counter({name: 0 for name in label_names})
    for s in shards:
        objects.update(dict(s.object_counts))
    facts: dict[str, Any] = {
        "object_counts": {name: objects[name] for name in label_names},
        "objects_cut_by_crop": sum(s.objects_cut for s in shards),
    }
    if "mask" in kinds:
        # A mask's ids are the user's numbers, not label_names' places: the ones seen.
        facts["mask_class_ids"] = sorted({i for s in shards for i in s.mask_ids})
    return facts


def _annotation_facts(summary: dict, label_names: list[str]) -> dict:
    """What an annotated dataset's manifest adds: its task, its classes' COCO ids, and the
    annotations its examples hold."""
    # "multi_label" when no example holds a box, else "detection" (boxes, and image-level classes).
    kinds = summary.get("annotation_kinds", [])
    has_objects = "objects" in kinds
    facts: dict[str, Any] = {
        "task": "detection" if has_objects else "segmentation" if "mask" in kinds else "multi_label"
    }
    if summary.get("category_ids"):
        # Each class's COCO category id: predictions mapped back through it evaluate with COCO's tools.
        facts["category_ids"] = {
            name: summary["category_ids"][name] for name in label_names if name in summary["category_ids"]
        }
    facts["annotations"] = {
        "instance_masks": "instance_masks" in kinds,
        "semantic_masks": "mask" in kinds,
        # Pixels outside the image in the pad mode's semantic masks (never a class of the data).
        **({"mask_pad_class": PAD_CLASS} if "mask" in kinds else {}),
    }
    return facts


def feature_declarations(annotated: bool, kinds: Sequence[str] = (), *, near_copies: bool = False) -> dict:
    """The manifest's `features`: each key's dtype and shape, [] for one value, [null] for a list."""
    features: dict[str, dict[str, Any]] = {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURE_DTYPES.items()}
    if annotated:
        features.update({key: {"dtype": dtype, "shape": [None]} for key, dtype in LIST_FEATURE_DTYPES.items()})
    if "instance_masks" in kinds:
        features.update({key: {"dtype": dtype, "shape": [None]} for key, dtype in INSTANCE_MASK_DTYPES.items()})
    if "mask" in kinds:
        features.update({key: {"dtype": dtype, "shape": []} for key, dtype in SEMANTIC_MASK_DTYPES.items()})
    if near_copies:
        features[NEAR_COPY_KEY] = {"dtype": "string", "shape": []}
    return features


def _emptied_class_warnings(summary: dict, splits: dict) -> list[str]:
    """Classes the plan gave a split that none of their examples reached (all dead letters): the
    plan's warnings could not know, and a split silently without a class is a wrong dataset."""
    warnings = []
    for split, facts in splits.items():
        planned = summary.get("splits", {}).get(split, {}).get("class_counts", {})
        emptied = [label for label, count in facts["class_counts"].items() if not count and planned.get(label)]
        if emptied:
            warnings.append(
                f"split {split!r} has no example left of {', '.join(map(repr, emptied))}: "
                f"every input of {'it' if len(emptied) == 1 else 'them'} there is a dead letter"
            )
    return warnings


def applied_settings(settings: dict, summary: dict) -> dict:
    """The settings as applied: --splits (and its rule) that no input took are recorded as null,
    not as fractions the dataset does not have. The fingerprint keeps the settings as given."""
    if summary.get("splits_ignored"):
        return {**settings, "splits": None, "split_rule": None}
    return settings

"""--append: a new version that lists the current version's shards, untouched, plus new ones.

The current version's inputs are known from its shards' sidecars (shard_sidecar.py records, per
shard, each input's path relative to its source's root, the sha256 of its bytes, and the size and
time its source had when it was converted), so only inputs that no shard holds are planned and
converted. An input is who it is relative to its root, never where the root is mounted: a dataset
and its input folder may each be moved, copied or remounted. Size and time are a hint; only other
bytes, another label, other annotations or another split make a held input "changed". Label ids
never change: the current version's label names keep their ids, new labels get the next ones. A
source that changed or disappeared since it was converted is reported; by default the append is
refused, so that nothing is kept or dropped silently.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterator, Mapping

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import JobError
from beam_jobs.planning.rules import plan_warnings
from beam_jobs.writing.convert_shards import sidecar_name
from beam_jobs.writing.duplicates import conflicting_label_warnings

__all__ = [
    "CHANGED_SOURCE_POLICIES",
    "WHOLE_DATASET_WARNING",
    "SourceChangesError",
    "annotation_kinds_of",
    "check_source_changes",
    "held_content_keys",
    "held_sidecars",
    "merge_appended",
    "read_held_inputs",
]

CHANGED_SOURCE_POLICIES = ("refuse", "keep")


class SourceChangesError(JobError):
    """--append found inputs of the current version whose sources changed or are gone."""


def held_sidecars(manifest: dict) -> list[str]:
    """The sidecar of each shard the manifest lists, relative to the output folder. Pure."""
    paths = []
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            folder, _, name = shard["file"].rpartition("/")
            paths.append(f"{folder}/{sidecar_name(name)}" if folder else sidecar_name(name))
    return sorted(paths)


def read_held_inputs(relative: str, *, output_dir: str, version: int) -> Iterator[tuple[str, dict]]:
    """(identity, {"state", "digests", "label", "split", "annotations", "uri", "written",
    "content_key", "phash", "user_group"}) for each input one shard holds as an example, from its
    sidecar (its dead letters are not held).

    The identity is the input's path relative to its source's root (InputFile.filename), the
    key an append joins its listing on. "digests" is the sha256 of its source (and its mask's)
    when converted, None where unknown; "content_key" the (sha256, label) its example was
    recorded under, None for a dead letter; "phash" and "user_group" its perceptual signature
    and user group, None where the version was made without --split_groups. Sidecars written
    before the relative names were recorded are read too: see ``_identities``."""
    path = FileSystems.join(output_dir, relative)
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            sidecar = json.loads(handle.read().decode("utf-8"))
        inputs, sources = sidecar["inputs"], sidecar["sources"]
        labels, split = sidecar["input_labels"], sidecar["split"]
        content_keys = {filename: (sha256, label) for sha256, filename, label in sidecar.get("content_keys", [])}
        dead = {letter[0] for letter in sidecar.get("dead_letters", [])}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise JobError(
            f"--append: {path} (the record of which inputs a shard of version {version} holds) cannot be "
            f"read ({type(error).__name__}: {error}); datasets written by releases before versioned datasets "
            "keep no such record: rebuild once with --overwrite, then append"
        ) from None
    if not len(inputs) == len(sources) == len(labels):  # zip would drop the tail without a word
        raise JobError(
            f"--append: {path} (the record of which inputs a shard of version {version} holds) lists "
            f"{len(inputs)} inputs but {len(sources)} source states and {len(labels)} labels; it was changed "
            "after the run that wrote it: rebuild once with --overwrite, then append"
        )
    # Sidecars of inputs without annotations record none (and those of earlier releases neither).
    digests = sidecar.get("input_annotations") or [None] * len(inputs)
    names = sidecar.get("input_filenames") or _identities(inputs, dead, list(content_keys))
    sha256s = sidecar.get("input_sha256") or [_recorded_digest(name, content_keys) for name in names]
    phashes = sidecar.get("input_phash") or [None] * len(inputs)
    user_groups = sidecar.get("input_user_groups") or [None] * len(inputs)
    if not len(digests) == len(names) == len(sha256s) == len(phashes) == len(user_groups) == len(inputs):
        raise JobError(
            f"--append: {path} lists {len(inputs)} inputs but {len(digests)} annotation records, "
            f"{len(names)} names, {len(sha256s)} digests, {len(phashes)} signatures and {len(user_groups)} "
            "user groups; it was changed after the run that wrote it: rebuild once with --overwrite, then append"
        )
    unreadable = [phash for phash in phashes if phash is not None and not _is_hex(phash)]
    if unreadable:
        raise JobError(
            f"--append: {path} records a signature that is no hexadecimal number ({unreadable[0]!r}); it was "
            "changed after the run that wrote it: rebuild once with --overwrite, then append"
        )
    rows = zip(inputs, names, sources, sha256s, labels, digests, phashes, user_groups, strict=True)
    for uri, name, state, sha256, label, digest, phash, user_group in rows:
        if name not in content_keys or uri in dead:
            # A dead letter is not held: the version has no example of it, so an append retries
            # it (fixed, or still bad), and one that is gone since was never the version's to lose.
            continue
        yield (
            name,
            {
                "state": state,
                "digests": sha256 if sha256 and None not in sha256 else None,
                "label": label,
                "split": split,
                "annotations": digest,
                "uri": uri,
                "written": name in content_keys and uri not in dead,
                "content_key": list(content_keys[name]) if name in content_keys and uri not in dead else None,
                "phash": None if phash is None else int(phash, 16),
                "user_group": user_group,
            },
        )


def _identities(inputs: list[str], dead: set[str], written: list[str]) -> list[str]:
    """The relative names of a sidecar's inputs where it records only their absolute uris (one
    written before the names were): an example's content key names it relative to the root, so
    the root is what its uri has before that name, and every input under it is named relative to
    it. An input of a shard with no example keeps its uri (no root is known there)."""
    converted = [uri for uri in inputs if uri not in dead]
    roots = {
        uri[: -len(name)]
        for uri, name in zip(converted, written, strict=False)
        if len(converted) == len(written) and uri.endswith(name)
    }
    if len(roots) != 1:
        return list(inputs)
    root = roots.pop()
    return [uri[len(root) :] if uri.startswith(root) else uri for uri in inputs]


def _recorded_digest(name: str, content_keys: Mapping[str, tuple[str, str]]) -> list | None:
    """[sha256] of an input whose example's content key records it, in an earlier release's sidecar."""
    return [content_keys[name][0]] if name in content_keys else None


def held_content_keys(held: tuple[str, dict]) -> list[tuple[str, tuple[str, str]]]:
    """(sha256 of the source, (identity, label)) of a held input that is an example of the
    version, in the shape of convert_shards' content keys: an append finds new inputs whose bytes
    the version holds, and reports identical content across versions, by them."""
    name, record = held
    key = record.get("content_key")
    return [(key[0], (name, key[1]))] if key else []


def check_source_changes(changes: Mapping, *, policy: str, version: int) -> dict:
    """Refuses an append over changed or removed sources unless ``policy`` is "keep"; returns
    ``changes`` (the facts SourceChangesFn gathers). Pure."""
    changed, removed = changes.get("changed", 0), changes.get("removed", 0)
    if policy == "keep" or not (changed or removed):
        return dict(changes)
    parts = []
    if changed:
        parts.append(
            f"{changed} input{'s' if changed != 1 else ''} of version {version} changed (content, label, "
            f"annotations, group or split) since {'they were' if changed != 1 else 'it was'} converted "
            f"({_shown(changes, 'changed')})"
        )
    if removed:
        parts.append(
            f"{removed} input{'s are' if removed != 1 else ' is'} no longer listed ({_shown(changes, 'removed')})"
        )
    raise SourceChangesError(
        "--append: " + " and ".join(parts) + "; nothing was converted. Pass --changed_sources keep to keep "
        "their examples as version " + str(version) + " holds them (reported in dataset_info.json's warnings), "
        "or rebuild with --overwrite"
    )


def _shown(changes: Mapping, kind: str) -> str:
    examples = list(changes.get(f"{kind}_examples", []))
    more = changes.get(kind, 0) - len(examples)
    return ", ".join(examples[:3]) + (f" and {more + len(examples[3:])} more" if more + len(examples[3:]) > 0 else "")


# Warnings of a plan that are facts of the whole dataset, not of one run's inputs: an append
# recomputes them over the merged counts (the new inputs alone would miss classes they lack, and
# an --splits the new inputs did not need is not "ignored" by the dataset).
WHOLE_DATASET_WARNING = re.compile(
    r"^(split '.*' has no example of |--splits .* was ignored: |"
    r"split '.*' has no example left of |\d+ images? with identical content carr(?:y|ies) more than one label: )"
)
_CONFLICTING_LABELS = re.compile(r"^\d+ images? with identical content carr(?:y|ies) more than one label: ")


_MISSING_CLASS = re.compile(r"^split '.*' has no example of ")
# Warnings the version held that each run says again of its own plan when still true: groups across
# splits and a --group_pattern that formed no group (an append's plan reports them over the whole
# version, held and new), and a requested split that none of a run's new inputs went to (true of
# that run's inputs, not of the version's).
_SAID_AGAIN_BY_EACH_RUN = re.compile(
    r"^(\d+ group\(s\) hold inputs whose splits were given |--splits asks for '.*', but none of the \d+ inputs "
    r"|--group_pattern '.*' (matched no input|captured a different value))"
)


def _merged_warnings(
    base: dict, added: dict, splits: dict, label_names: list[str], duplicates: list[dict]
) -> list[str]:
    """The warnings of base and of the append run, without those about the whole dataset, which
    are computed again from the merged per-split class counts and content duplicates; each said once."""

    held = [w for w in base.get("warnings", []) if not _SAID_AGAIN_BY_EACH_RUN.match(w)]
    kept = [w for w in [*held, *added.get("warnings", [])] if not WHOLE_DATASET_WARNING.match(w)]
    # The plan's own rule and wording for a class missing from a split, over the merged counts.
    merged = plan_warnings(
        {split: facts["class_counts"] for split, facts in splits.items()},
        label_names,
        requested=None,
        num_unsplit=0,
        retired=added.get("retired_labels", ()),  # kept at their ids, missing from every split on purpose
    )
    kept += [w for w in merged if _MISSING_CLASS.match(w)]
    # A fresh run's own wording for identical images under several labels, over the whole version.
    kept += [w for w in conflicting_label_warnings(duplicates) if _CONFLICTING_LABELS.match(w)]
    return list(dict.fromkeys(kept))


def _merged_duplicates(base: dict, added: dict) -> list[dict]:
    """The content duplicates of the whole version, one group per content: the append run groups
    its new examples with the held ones of equal bytes (pipeline.py), so a group may extend one
    of base's."""
    files: dict[str, set[str]] = collections.defaultdict(set)
    labels: dict[str, set[str]] = collections.defaultdict(set)
    for group in [*base.get("content_duplicates", []), *added.get("content_duplicates", [])]:
        files[group["sha256"]].update(group["files"])
        labels[group["sha256"]].update(group["labels"])
    groups = [
        {
            "sha256": sha256,
            "files": sorted(files[sha256]),
            "labels": sorted(labels[sha256]),
            "conflicting_labels": len(labels[sha256]) > 1,
        }
        for sha256 in files
    ]
    return sorted(groups, key=lambda group: group["files"])


def _layout(info: dict) -> dict:
    """What every record of a version shares: an append whose records differ in any of it would
    make a version that no one reader reads whole (scalar labels beside lists, boxes beside none,
    one size beside its own sizes)."""
    return {
        "task": info.get("task", "classification"),
        "annotations": info.get("annotations"),
        "own sizes": info.get("image", {}).get("height") is None,
    }


def annotation_kinds_of(info: dict) -> tuple[str, ...]:
    """What a version's examples hold, as the plan names it (() for a one-label dataset), read
    back from its manifest: an append plans its rows with it."""
    if info.get("task", "classification") == "classification":
        return ()
    annotations = info.get("annotations") or {}
    kinds = {"annotated", "labels"}
    if info["task"] == "detection":
        kinds.add("objects")
    if annotations.get("semantic_masks"):
        kinds.add("mask")
    if annotations.get("instance_masks"):
        kinds.add("instance_masks")
    return tuple(sorted(kinds))


def check_same_layout(base: dict, added: dict) -> None:
    """Refuses an append whose examples are not laid out as the version's: the new rows must
    carry the same kind of annotations (labels, boxes, masks) and sizes as the rows before."""
    before, now = _layout(base), _layout(added)
    differ = [key for key in before if before[key] != now[key]]
    if differ:
        shown = "; ".join(f"{key}: {before[key]!r} before, {now[key]!r} now" for key in differ)[:600]
        raise JobError(
            f"an append must write examples laid out as the version it appends to, and these differ: {shown}. "
            "Give the new inputs the same kind of annotations (labels, objects, masks) and the same "
            "--resize_mode, or convert them into a dataset of their own"
        )


def _merged_category_ids(base: dict, added: dict) -> dict[str, int]:
    """The COCO category ids of both versions' classes; one class given another id is refused."""
    before, now = base.get("category_ids", {}), added.get("category_ids", {})
    clashes = sorted(name for name in set(before) & set(now) if before[name] != now[name])
    if clashes:
        raise JobError(
            f"an append must keep each class's COCO category id: {', '.join(repr(n) for n in clashes[:5])} "
            f"had {[before[n] for n in clashes[:5]]} and now {[now[n] for n in clashes[:5]]}"
        )
    names = list(added["label_names"])
    merged = {**before, **now}
    return {name: merged[name] for name in names if name in merged}


def merge_appended(base: dict, added: dict, *, changes: Mapping | None = None) -> dict:
    """The manifest of base + added: ``added`` is the manifest of the append run's own shards
    (build_dataset_info), whose label_names extend base's. Pure.

    Per split the shards are base's, in order, then the new ones; counts add up. The dead
    letters are the append run's (it retried every input the base did not hold, those that
    failed before included); the inputs count the base's examples plus the run's inputs.
    """
    label_names = list(added["label_names"])
    if label_names[: len(base["label_names"])] != list(base["label_names"]):
        raise ValueError("an append must keep the label ids of the version it appends to")
    check_same_layout(base, added)
    splits = {}
    for name in sorted(set(base["splits"]) | set(added["splits"])):
        old, new = base["splits"].get(name), added["splits"].get(name)
        parts = [part for part in (old, new) if part]
        classes: collections.Counter[str] = collections.Counter()
        for part in parts:
            classes.update(part.get("class_counts", {}))
        splits[name] = {
            "num_examples": sum(part["num_examples"] for part in parts),
            "num_shards": sum(len(part["shards"]) for part in parts),
            "class_counts": {label: classes[label] for label in label_names},
            "dead_letters_by_reason": dict((new or {}).get("dead_letters_by_reason", {})),
            "shards": [shard for part in parts for shard in part["shards"]],
        }
        if any("object_counts" in part for part in parts):
            objects: collections.Counter[str] = collections.Counter()
            for part in parts:
                objects.update(part.get("object_counts", {}))
            splits[name]["object_counts"] = {label: objects[label] for label in label_names}
            splits[name]["objects_cut_by_crop"] = sum(part.get("objects_cut_by_crop", 0) for part in parts)
        if any("mask_class_ids" in part for part in parts):
            splits[name]["mask_class_ids"] = sorted({i for part in parts for i in part.get("mask_class_ids", [])})
    held = sum(split["num_examples"] for split in base["splits"].values())
    duplicates = _merged_duplicates(base, added)
    warnings = _merged_warnings(base, added, splits, label_names, duplicates)
    if changes and (changes.get("changed") or changes.get("removed")):
        warnings.append(
            f"--append --changed_sources keep: {changes.get('changed', 0)} changed and {changes.get('removed', 0)} "
            f"removed source(s) keep the examples version {base.get('version', 1)} made of them "
            f"(e.g. {', '.join([*changes.get('changed_examples', []), *changes.get('removed_examples', [])][:3])})"
        )
    category_ids = _merged_category_ids(base, added)
    return {
        **added,
        # The dataset's settings stay the version's: an append makes examples alike (its
        # fingerprint matched), and may only have cut them into another shard count or size.
        **{key: base[key] for key in ("fingerprint", "preprocessing") if key in base},
        **({"category_ids": category_ids} if category_ids else {}),
        "label_names": label_names,
        "num_classes": len(label_names),
        "splits": splits,
        "warnings": warnings,
        "num_inputs": held + added["num_inputs"],
        "content_duplicates": duplicates,
    }


def _is_hex(value: object) -> bool:
    """Whether a sidecar's recorded signature is what the job writes (hex digits); a hand edit
    otherwise fails the append with a bare ValueError deep in the pipeline."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]+", value) is not None

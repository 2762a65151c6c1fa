"""Finalising a run: commit the staged shards, then write dead_letters.jsonl and dataset_info.json."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import beam_jobs
from beam_jobs.config import ImageConfig
from beam_jobs.errors import Reason
from beam_jobs.imaging.example import FEATURE_DTYPES, INSTANCE_MASK_DTYPES, LIST_FEATURE_DTYPES, SEMANTIC_MASK_DTYPES
from beam_jobs.imaging.masks import PAD_CLASS
from beam_jobs.imaging.resample import LEGACY_RESAMPLE
from beam_jobs.records import DeadLetter, ShardResult
from beam_jobs.storage import concatenate_atomically, delete_exactly, list_folder, write_atomically
from beam_jobs.writing.append import merge_appended
from beam_jobs.writing.commit import DATASET_INFO, Current, commit_version
from beam_jobs.writing.duplicates import conflicting_label_warnings, content_duplicate_groups  # noqa: F401 (named here too)
from beam_jobs.writing.run_folders import run_dir, run_prefix, sidecar_name
from beam_jobs.writing.shard_progress import progress_file_name

__all__ = [
    "DATASET_INFO",
    "DEAD_LETTERS_FILE",
    "DROPPED_REASONS",
    "REFUSED_DEAD_LETTERS_FILE",
    "ANNOTATED_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "feature_declarations",
    "TooManyBadInputsError",
    "build_dataset_info",
    "check_bad_fraction",
    "DEAD_LETTER_PARTS",
    "content_duplicate_groups",
    "dead_letter_part",
    "is_dataset_file",
    "is_own_plan",
    "remove_root_leftovers",
    "plan_warning_lines",
    "run_fingerprint",
    "write_dead_letter_part",
    "write_plan",
]

_LOG = logging.getLogger(__name__)
# Lines shown only with --log_level INFO or DEBUG (see pipeline.py).
_DETAILS = logging.getLogger("beam_jobs.details")

PLAN_FILE = "plan.json"
PLAN_DEAD_LETTERS_FILE = "plan_dead_letters.jsonl"

DEAD_LETTERS_FILE = "dead_letters.jsonl"
# Where a refused run's dead letters go when the folder still holds a dataset that they would
# otherwise contradict (--overwrite keeps the old dataset whole until a run succeeds).
REFUSED_DEAD_LETTERS_FILE = "dead_letters.refused_run.jsonl"
# Inputs dropped on purpose as copies of another (--dedup): reported, but not unusable.
DROPPED_REASONS = frozenset({Reason.DUPLICATE_INPUT, Reason.DUPLICATE_CONTENT})
_SHARD_FILE = re.compile(r"^(?P<split>.+)-\d{5}-of-\d{5}\.tfrecord$")
_PROGRESS_FILE = re.compile(r"^\.progress-.+\.json$")  # see shard_progress.progress_file_name
_SHARD_NOTE = re.compile(r"^\.progress-.+\.tfrecord\.json$")  # see shard_progress.progress_note_name


def is_dataset_file(name: str) -> bool:
    """True for the names this job writes into an output folder (shards, their hidden staged and
    temporary forms, the two JSON files)."""
    return (
        bool(_SHARD_FILE.match(name))
        or name in (DATASET_INFO, DEAD_LETTERS_FILE, REFUSED_DEAD_LETTERS_FILE)
        or name.startswith((".staged-", ".tmp-"))
    )


# The manifest's format: 1 for one-label datasets of one image size, as every release wrote them;
# 2 where each image keeps its own size (image height and width null) or examples hold lists
# (annotated). A dataset is written with the lowest version that describes it, so the readers of
# earlier releases still read what they can, and refuse what they would misread.
SCHEMA_VERSION = 1
ANNOTATED_SCHEMA_VERSION = 2
PRODUCER = "images-to-tfrecords"


class TooManyBadInputsError(RuntimeError):
    """More inputs were unusable than --max_bad_fraction allows."""


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
    results_list = sorted(results)
    for result in results_list:
        by_split.setdefault(result.split, []).append(result)
    label_names = list(summary["label_names"])
    splits = {}
    for split, shards in sorted(by_split.items()):
        classes: collections.Counter[str] = collections.Counter({name: 0 for name in label_names})
        reasons: collections.Counter[str] = collections.Counter()
        for s in shards:
            classes.update(dict(s.class_counts))
            reasons.update(dict(s.dead_letters_by_reason))
        splits[split] = {
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
    annotated = bool(summary.get("annotated"))
    if annotated:
        for split, shards in sorted(by_split.items()):
            objects: collections.Counter[str] = collections.Counter({name: 0 for name in label_names})
            for s in shards:
                objects.update(dict(s.object_counts))
            splits[split]["object_counts"] = {name: objects[name] for name in label_names}
            splits[split]["objects_cut_by_crop"] = sum(s.objects_cut for s in shards)
            if "mask" in summary.get("annotation_kinds", ()):
                # A mask's ids are the user's numbers, not label_names' places: the ones seen.
                splits[split]["mask_class_ids"] = sorted({i for s in shards for i in s.mask_ids})
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
        "features": feature_declarations(annotated, summary.get("annotation_kinds", ())),
        "preprocessing": {**config.to_json(), **_applied(settings, summary)},
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
    }
    if annotated:
        # "multi_label" when no example holds a box, else "detection" (boxes, and image-level classes).
        kinds = summary.get("annotation_kinds", [])
        has_objects = "objects" in kinds
        info["task"] = "detection" if has_objects else "segmentation" if "mask" in kinds else "multi_label"
        if summary.get("category_ids"):
            # Each class's COCO category id: predictions mapped back through it evaluate with COCO's tools.
            info["category_ids"] = {
                name: summary["category_ids"][name] for name in label_names if name in summary["category_ids"]
            }
        info["annotations"] = {
            "instance_masks": "instance_masks" in kinds,
            "semantic_masks": "mask" in kinds,
            # Pixels outside the image in the pad mode's semantic masks (never a class of the data).
            **({"mask_pad_class": PAD_CLASS} if "mask" in kinds else {}),
        }
    return info


def feature_declarations(annotated: bool, kinds: Sequence[str] = ()) -> dict:
    """The manifest's `features`: each key's dtype and shape, [] for one value, [null] for a list."""
    features: dict[str, dict[str, Any]] = {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURE_DTYPES.items()}
    if annotated:
        features.update({key: {"dtype": dtype, "shape": [None]} for key, dtype in LIST_FEATURE_DTYPES.items()})
    if "instance_masks" in kinds:
        features.update({key: {"dtype": dtype, "shape": [None]} for key, dtype in INSTANCE_MASK_DTYPES.items()})
    if "mask" in kinds:
        features.update({key: {"dtype": dtype, "shape": []} for key, dtype in SEMANTIC_MASK_DTYPES.items()})
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


def _applied(settings: dict, summary: dict) -> dict:
    """The settings as applied: --splits (and its rule) that no input took are recorded as null,
    not as fractions the dataset does not have. The fingerprint keeps the settings as given."""
    if summary.get("splits_ignored"):
        return {**settings, "splits": None, "split_rule": None}
    return settings


# What to do about the reasons that can refuse a whole run by themselves (a layout or a policy,
# not a broken file): said on the console, since few open dead_letters.jsonl before retrying.
_REASON_FIXES = {
    Reason.OUTSIDE_INPUT_ROOT: (
        "entries outside the input list's folder (or symlinks out of the tree) are "
        "refused: pass --allow_outside_root to accept them"
    ),
    Reason.UNEXPECTED_LAYOUT: (
        "images must sit in one folder per class (ROOT/<label>/<image>, or "
        "ROOT/<split>/<label>/<image>): put them in class folders, or give a CSV "
        "or JSONL list with --manifest"
    ),
}


def refusal_hint(by_reason: dict[str, int]) -> str:
    """The main reasons of a refusal (the three commonest), and the fix for those that have one."""
    if not by_reason:
        return ""
    ranked = sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))
    text = "main reasons: " + ", ".join(f"{reason} {count}" for reason, count in ranked[:3])
    fixes = [_REASON_FIXES[reason] for reason, _ in ranked[:3] if reason in _REASON_FIXES]
    return text + "".join(f"; {fix}" for fix in fixes)


def check_bad_fraction(
    *,
    num_dead: int,
    num_inputs: int,
    max_bad_fraction: float,
    dead_letters_uri: str,
    kept_message: str = "no dataset_info.json was written",
    by_reason: dict[str, int] | None = None,
) -> None:
    """``num_dead`` counts unusable inputs only, ``num_inputs`` the inputs that were not dropped as
    copies: --dedup content drops copies on purpose, and they must not fail the job."""
    if num_inputs and num_dead / num_inputs > max_bad_fraction:
        hint = refusal_hint(by_reason or {})
        raise TooManyBadInputsError(
            f"{num_dead} of {num_inputs} inputs ({num_dead / num_inputs:.1%}) could not be used, more than "
            f"--max_bad_fraction={max_bad_fraction}" + (f" ({hint})" if hint else "") + f"; {kept_message}. "
            f"See {dead_letters_uri} for each file and the reason: "
            + (
                # No fraction accepts a dataset of no examples (finalize_outputs refuses it).
                "fix or replace those files; no --max_bad_fraction accepts a run in which no input is usable."
                if num_dead >= num_inputs
                else f"fix or remove those files, or accept them by rerunning with "
                f"--max_bad_fraction={accepting_fraction(num_dead, num_inputs)}."
            )
        )


def accepting_fraction(num_dead: int, num_inputs: int) -> float:
    """The smallest --max_bad_fraction of two decimals that lets ``num_dead`` of ``num_inputs``
    pass (the check refuses only a fraction above it). Pure."""
    return min(1.0, math.ceil(num_dead / num_inputs * 100 - 1e-9) / 100)


def dead_letters_jsonl(dead_letters: Iterable[DeadLetter]) -> bytes:
    """One JSON object per line, sorted, so the file is identical on every run and runner."""
    lines = [json.dumps(d.to_json(), ensure_ascii=False, sort_keys=True) for d in sorted(dead_letters)]
    return "".join(line + "\n" for line in lines).encode("utf-8")


# Dead letters are written in this many parts, each sorted, and concatenated in part order: no
# step holds them all (a web-scale input list can have millions of bad rows).
DEAD_LETTER_PARTS = 64


def dead_letter_part(letter: DeadLetter) -> int:
    """The part a dead letter is written in: a stable hash, the same on every runner."""
    digest = hashlib.sha256("\0".join((letter.uri, letter.stage, letter.reason, letter.detail)).encode("utf-8"))
    return int.from_bytes(digest.digest()[:4], "big") % DEAD_LETTER_PARTS


def part_file_name(part: int, prefix: str = "dead_letters") -> str:
    return f".staged-{prefix}-{part:05d}-of-{DEAD_LETTER_PARTS:05d}.jsonl"


def write_dead_letter_part(
    group: tuple[int, Iterable[DeadLetter]], *, output_dir: str, prefix: str = "dead_letters"
) -> dict:
    """Writes one part (sorted) under a hidden name; returns its small facts for finalize."""
    part, letters = group
    letters = sorted(letters)
    write_atomically(FileSystems.join(output_dir, part_file_name(part, prefix)), dead_letters_jsonl(letters))
    return {
        "part": part,
        "count": len(letters),
        "by_reason": dict(collections.Counter(letter.reason for letter in letters)),
    }


def is_own_plan(path: str) -> bool:
    """True when ``path`` is a plan.json this job wrote (--plan_only), which a later run may replace
    or remove; a user's own plan.json (anything else under that common name) is never touched.

    Plans name their producer; older ones are known by their shape (``would_fail`` and a
    ``dead_letters.file`` of plan_dead_letters.jsonl).
    """
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            plan = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(plan, dict):
        return False
    producer, dead = plan.get("producer"), plan.get("dead_letters")
    if isinstance(producer, dict):
        return producer.get("name") == PRODUCER
    return "would_fail" in plan and isinstance(dead, dict) and dead.get("file") == PLAN_DEAD_LETTERS_FILE


def remove_root_leftovers(output_dir: str, *, run_id: str | None = None) -> list[str]:
    """Deletes, after a commit, what the output folder's top level must not keep; returns the names.

    That is: temp files of killed writers (this run holds the lock, so no writer is alive); the
    hidden staged files, sidecars and dead-letter parts that releases before versioned datasets
    left in the top level; their refused-run dead letters; the files of an earlier --plan_only,
    which no longer describe what is there (only the job's own plan: plan.json is a common name);
    and the progress files of other runs. Nothing a manifest lists lives here any more (shards sit
    in run folders, which the garbage collection handles), and a file of the user's, even one
    named like a shard, is never touched.
    """
    own_progress = None if run_id is None else progress_file_name(run_id)
    listing = {meta.path.rsplit("/", 1)[-1]: meta.path for meta in list_folder(output_dir)}
    plan_files = (
        (PLAN_FILE, PLAN_DEAD_LETTERS_FILE) if PLAN_FILE not in listing or is_own_plan(listing[PLAN_FILE]) else ()
    )
    doomed = [
        path
        for name, path in listing.items()
        if name.startswith((".tmp-", ".staged-"))
        or name == REFUSED_DEAD_LETTERS_FILE
        or name in plan_files
        or (_PROGRESS_FILE.match(name) and name != own_progress)
    ]
    delete_exactly(doomed)
    return sorted(path.rsplit("/", 1)[-1] for path in doomed)


def finalize_outputs(
    results: list[ShardResult],
    summary: dict,
    dead_parts: list[dict],
    content_duplicates: list[dict],
    *,
    output_dir: str,
    run: str,
    expected: Current,
    change_kind: str,
    config: ImageConfig,
    settings: dict,
    max_bad_fraction: float,
    keep_versions: int = 2,
    run_id: str | None = None,
    base: dict | None = None,
) -> dict:
    """Checks the bad fraction, then commits the run's folder as the dataset's next version.

    With ``base`` (--append: the current manifest), the version lists base's shards, untouched,
    then this run's (append.merge_appended); an append that found nothing new commits nothing.

    ``summary`` is the plan's small facts (label names, input count); ``dead_parts`` the facts of
    the dead-letter parts in the run folder (see write_dead_letter_part), concatenated in order
    into the run's dead_letters.jsonl. ``expected`` is the version the run started from: the
    commit succeeds only if it is still current (commit.py), so two runs never both commit over
    one parent.

    Nothing a committed version lists is written, renamed or deleted here before the commit: the
    shards are already complete, under their final names, in the run's own folder. The commit is
    the one atomic write of dataset_info.json; a kill before it leaves the previous version
    current and whole, a kill after it the new one. Only then are the files of versions outside
    the retention window (``keep_versions``: the current one and those before it) removed, so a
    trainer that opened the previous version goes on reading it whole.

    A refused run commits nothing: its shards stay in its folder for a --resume (after fixing
    inputs or raising the threshold, which redoes nothing that was good), with its dead letters
    beside them.
    """
    folder = run_dir(output_dir, run)
    parts = sorted(dead_parts, key=lambda p: p["part"])
    part_paths = [FileSystems.join(folder, part_file_name(p["part"])) for p in parts]
    dead_letters_path = FileSystems.join(folder, DEAD_LETTERS_FILE)
    by_reason: collections.Counter[str] = collections.Counter()
    for part in parts:
        by_reason.update(part["by_reason"])
    num_dead = sum(by_reason.values())
    dropped = sum(count for reason, count in by_reason.items() if reason in DROPPED_REASONS)
    unusable, considered = num_dead - dropped, summary["num_inputs"] - dropped
    concatenate_atomically(dead_letters_path, part_paths)
    # The parts are all in the file just written; left behind they would be litter (on an
    # object store, for good) and nothing reads them again.
    delete_exactly(part_paths)
    if base is not None and not any(result.num_examples for result in results):
        # Nothing new became an example: a version equal to the current one would only be noise
        # (a nightly append over a folder with one bad file would commit one every night). Its
        # shards hold no example: left behind, they would read as an interrupted run to --resume
        # and to the next run's warning. Its dead letters stay, for the user to read.
        delete_exactly([FileSystems.join(folder, name) for r in results for name in (r.file, sidecar_name(r.file))])
        _DETAILS.info(
            "--append: no new example; version %s stays current%s",
            expected.version,
            f" ({num_dead} dead letters in {dead_letters_path})" if num_dead else "",
        )
        return base
    # A dataset of no examples is never what a user wants, whatever --max_bad_fraction allows.
    empty = not any(result.num_examples for result in results) and base is None
    if empty or (considered and unusable / considered > max_bad_fraction):
        kept = (
            f"version {expected.version} of the dataset stays current, unchanged"
            if expected.manifest
            else "no dataset_info.json was written"
        )
        if results:
            kept += (
                f"; the {len(results)} shard{'s' if len(results) != 1 else ''} converted so far "
                f"{'stays' if len(results) == 1 else 'stay'} in {folder} (no version lists it), and "
                f"a rerun with --resume reuses {'it' if len(results) == 1 else 'them'}, redoing only what changed"
            )
        unusable_by_reason = {reason: count for reason, count in by_reason.items() if reason not in DROPPED_REASONS}
        check_bad_fraction(
            num_dead=unusable,
            num_inputs=considered,
            max_bad_fraction=max_bad_fraction,
            dead_letters_uri=dead_letters_path,
            kept_message=kept,
            by_reason=unusable_by_reason,
        )
        hint = refusal_hint(unusable_by_reason)
        raise TooManyBadInputsError(
            f"no input became an example ({unusable} of {considered} inputs could not be used"
            + (f"; {hint}" if hint else "")
            + f"); a dataset of no examples is refused, whatever "
            f"--max_bad_fraction allows; {kept}. See {dead_letters_path} for each file and the reason."
        )
    _remove_unlisted_shards(folder, results)
    info = build_dataset_info(
        summary,
        results,
        num_dead_letters=num_dead,
        config=config,
        settings=settings,
        content_duplicates=sorted(content_duplicates, key=lambda g: g["files"]),
        dead_letters_by_reason=dict(by_reason),
        run=run,
    )
    change: dict[str, Any] = {"kind": change_kind, "run": run}
    if summary.get("label_ids_changed"):
        change["label_ids"] = summary["label_ids_changed"]  # this version's own: never carried to the next
    if base is not None:
        change["added"] = {split: facts["num_examples"] for split, facts in info["splits"].items()}
        info = merge_appended(base, info, changes=summary.get("append"))
    committed = commit_version(output_dir, info, expected=expected, change=change)
    _clean_up_after_commit(output_dir, run=run, keep_versions=keep_versions, run_id=run_id)
    return committed


def _remove_unlisted_shards(folder: str, results: list[ShardResult]) -> None:
    """Deletes the shard files and sidecars in the run's folder that this run's results do not list.

    Once committed, a run folder must hold exactly the shards its manifest lists: a reader and
    `verify-tfrecords` refuse a shard-named file that is not listed. A --resume that continued a
    folder of an interrupted run with another plan (other splits or shard counts) would otherwise
    commit that run's extra shards beside its own. Done before the commit: the folder is still
    this run's alone, and no version lists what is removed.
    """
    listed = {name for result in results for name in (result.file, sidecar_name(result.file))}
    stray = []
    for meta in list_folder(folder):
        name = meta.path.rsplit("/", 1)[-1]
        shard = _SHARD_FILE.match(name) or (name.startswith(".") and _SHARD_FILE.match(name[1:].removesuffix(".json")))
        if shard and name not in listed:
            stray.append(meta.path)
    if stray:
        _LOG.info("removing %d shard file(s) this run does not list from %s", len(stray), folder)
        delete_exactly(stray)


def _clean_up_after_commit(output_dir: str, *, run: str, keep_versions: int, run_id: str | None) -> None:
    """Best effort: the new version is committed and whole whatever happens here; what a failure
    leaves (old versions' files, litter), the next commit or `versions gc` removes.

    The run holds the folder's lock, so every temp file and shard note in its own folder is a dead
    writer's (a bundle of a killed earlier attempt, continued by --resume)."""
    try:
        from beam_jobs.versions import collect_garbage  # pylint: disable=import-outside-toplevel  # cycle

        remove_root_leftovers(output_dir, run_id=run_id)
        # ... and the progress notes of its shards that killed workers left (shard_progress.py);
        # the run's own plan file stays until the launching process has had its last look.
        delete_exactly(
            [
                meta.path
                for meta in list_folder(run_dir(output_dir, run))
                if meta.path.rsplit("/", 1)[-1].startswith(".tmp-") or _SHARD_NOTE.match(meta.path.rsplit("/", 1)[-1])
            ]
        )
        collect_garbage(output_dir, keep=keep_versions, holding_run=run)
    except Exception as error:  # The dataset is committed: a clean-up failure must not fail the run.
        _LOG.warning(
            "the new version is committed, but cleaning up %s failed (%s): `python -m "
            "beam_jobs.versions %s gc` retries it",
            output_dir,
            error,
            output_dir,
        )


def _kept_changes(append: dict) -> str:
    """--changed_sources keep: the held sources whose bytes, label or annotations changed (or that
    are gone), whose examples stay as the version made them; said in the plan line, because an
    append that finds nothing new commits nothing and so writes no warning anywhere else."""
    changed, removed = append.get("changed", 0), append.get("removed", 0)
    if not (changed or removed):
        return ""
    examples = [*append.get("changed_examples", []), *append.get("removed_examples", [])][:3]
    return (
        f"; {changed} changed and {removed} no longer listed source(s) keep the examples the version made "
        f"(--changed_sources keep" + (f", e.g. {', '.join(examples)}" if examples else "") + ")"
    )


def plan_line(summary: dict, by_reason: dict[str, int]) -> str:
    """The plan in one line, in the Keras style: what a user checks before a long run."""
    splits = summary["splits"]
    total = sum(s["num_examples"] for s in splits.values())
    shown = (
        ", ".join(
            f"{name} {s['num_examples']} ({s['num_shards']} shard{'s' if s['num_shards'] != 1 else ''})"
            for name, s in splits.items()
        )
        or "no split"
    )
    ignored = sum(by_reason.values())
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items()))
    # Said only when some were not used: "0 listed files not used" on every run is noise.
    unused = f"; {ignored} listed file{'s' if ignored != 1 else ''} not used ({reasons})" if ignored else ""
    # The classes these images belong to: not a retired label, nor (appending) the version's others.
    with_images = {label for s in splits.values() for label, n in (s.get("class_counts") or {}).items() if n}
    classes = len(with_images) or len(summary["label_names"])
    append = summary.get("append")
    if append is not None:  # --append: what is new, beside what the current version holds
        held = append.get("held", 0) + append.get("changed", 0)
        kept = _kept_changes(append)
        if not total:
            return (
                f"Found no new images: the {held} listed {'is' if held == 1 else 'are'} in the current version"
                f"{kept}{unused}"
            )
        return (
            f"Found {total} new image{'s' if total != 1 else ''} ({held} already in the current version{kept}) "
            f"belonging to {classes} class{'es' if classes != 1 else ''}: {shown}{unused}"
        )
    return (
        f"Found {total} image{'s' if total != 1 else ''} belonging to {classes} class{'es' if classes != 1 else ''}"
        f": {shown}{unused}"
    )


def plan_warning_lines(summary: dict) -> list[str]:
    """The plan's warnings, one a line, to print under the plan line: where a user looks before a
    long run (a changed label map, a class missing from a split, merged split folders, --splits that
    did nothing)."""
    # A plan's own line, or the committed manifest's record of it (repeated under the final table).
    line = summary.get("label_ids_changed") or (summary.get("change") or {}).get("label_ids")
    label_ids = [line] if line else []
    return [f"WARNING: {warning}" for warning in [*label_ids, *summary.get("warnings", [])]]


def write_plan(
    summary: dict, dead_parts: list[dict], *, output_dir: str, settings: dict, max_bad_fraction: float = 1.0
) -> dict:
    """--plan_only: plan.json (counts per split, shard counts, per-class counts per split, the
    listing's dead letters by reason) and plan_dead_letters.jsonl, each written atomically.
    ``would_fail`` says why the full run would fail already from the listing (or is None)."""
    parts = sorted(dead_parts, key=lambda p: p["part"])
    by_reason: collections.Counter[str] = collections.Counter()
    for part in parts:
        by_reason.update(part["by_reason"])
    concatenate_atomically(
        FileSystems.join(output_dir, PLAN_DEAD_LETTERS_FILE),
        [FileSystems.join(output_dir, part_file_name(p["part"], "plan_dead_letters")) for p in parts],
    )
    planned = sum(split["num_examples"] for split in summary["splits"].values())
    unusable = sum(count for reason, count in by_reason.items() if reason not in DROPPED_REASONS)
    considered = summary["num_inputs"] - (sum(by_reason.values()) - unusable)
    verdict = None
    if planned == 0:
        verdict = "no input can become an example"
    elif considered and unusable / considered > max_bad_fraction:
        verdict = (
            f"{unusable} of {considered} inputs are refused already by the listing, more than "
            f"--max_bad_fraction={max_bad_fraction}: the full run would fail"
        )
    if verdict and (hint := refusal_hint(dict(by_reason))):
        verdict += f" ({hint})"  # the fix the full run's refusal gives (a flat folder: class folders)
    plan = {
        **summary,
        "producer": {"name": PRODUCER, "version": beam_jobs.__version__},
        "settings": _applied(settings, summary),
        "would_fail": verdict,
        "dead_letters": {
            "count": sum(by_reason.values()),
            "by_reason": dict(sorted(by_reason.items())),
            "file": PLAN_DEAD_LETTERS_FILE,
        },
    }
    write_atomically(
        FileSystems.join(output_dir, PLAN_FILE),
        (json.dumps(plan, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"),
    )
    delete_exactly([FileSystems.join(output_dir, part_file_name(p["part"], "plan_dead_letters")) for p in parts])
    return {**plan, "line": plan_line(summary, dict(by_reason))}

"""Finalising a run: commit the staged shards, then write dead_letters.jsonl and dataset_info.json.

The steps it takes are each a module of their own: dead_letter_files.py (the dead letters),
bad_inputs.py (the refusal), dataset_info.py (the manifest's content), leftovers.py (what the
commit removes) and plan_report.py (the plan's line and plan.json). This module names their public
parts too, for the modules that import them from here.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_jobs.config import ImageConfig
from beam_jobs.records import ShardResult
from beam_jobs.storage import concatenate_atomically, delete_exactly, list_folder
from beam_jobs.writing.append import merge_appended
from beam_jobs.writing.bad_inputs import (
    DROPPED_REASONS,
    TooManyBadInputsError,
    accepting_fraction,  # noqa: F401 (named here too)
    check_bad_fraction,
    refusal_hint,
)
from beam_jobs.writing.commit import DATASET_INFO, Current, commit_version
from beam_jobs.writing.dataset_info import (
    ANNOTATED_SCHEMA_VERSION,
    PRODUCER,  # noqa: F401 (named here too)
    SCHEMA_VERSION,
    build_dataset_info,
    feature_declarations,
    run_fingerprint,
)
from beam_jobs.writing.dead_letter_files import (
    DEAD_LETTER_PARTS,
    DEAD_LETTERS_FILE,
    REFUSED_DEAD_LETTERS_FILE,
    dead_letter_part,
    dead_letters_jsonl,  # noqa: F401 (named here too)
    part_file_name,
    write_dead_letter_part,
)
from beam_jobs.writing.duplicates import conflicting_label_warnings, content_duplicate_groups  # noqa: F401 (named here too)
from beam_jobs.writing.leftovers import is_dataset_file, is_shard_or_sidecar, is_writer_litter, remove_root_leftovers
from beam_jobs.writing.plan_report import (
    PLAN_DEAD_LETTERS_FILE,  # noqa: F401 (named here too)
    PLAN_FILE,  # noqa: F401 (named here too)
    is_own_plan,
    plan_line,  # noqa: F401 (named here too)
    plan_warning_lines,
    write_plan,
)
from beam_jobs.writing.run_folders import RUN_SETTINGS_FILE, forget_run_settings, run_dir, sidecar_name

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
    dead_letters_path = FileSystems.join(folder, DEAD_LETTERS_FILE)
    by_reason = _dead_letters_by_reason(dead_parts)
    num_dead = sum(by_reason.values())
    dropped = sum(count for reason, count in by_reason.items() if reason in DROPPED_REASONS)
    unusable, considered = num_dead - dropped, summary["num_inputs"] - dropped
    _concatenate_dead_letters(folder, dead_parts, dead_letters_path)
    if base is not None and not any(result.num_examples for result in results):
        _discard_empty_append(
            folder, results, expected=expected, num_dead=num_dead, dead_letters_path=dead_letters_path
        )
        return base
    _refuse_unusable_run(
        results,
        by_reason,
        unusable=unusable,
        considered=considered,
        max_bad_fraction=max_bad_fraction,
        folder=folder,
        dead_letters_path=dead_letters_path,
        expected=expected,
        appending=base is not None,
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
    info, change = _next_version(info, summary, change_kind=change_kind, run=run, base=base)
    # Before the commit, so that a kill between the commit and its clean-up leaves no record in a
    # committed folder: from here on every shard's sidecar names the run's settings, which
    # --resume reads first (run_folders.py).
    forget_run_settings(output_dir, run)
    committed = commit_version(output_dir, info, expected=expected, change=change)
    _clean_up_after_commit(output_dir, run=run, keep_versions=keep_versions, run_id=run_id)
    return committed


def _next_version(info: dict, summary: dict, *, change_kind: str, run: str, base: dict | None) -> tuple[dict, dict]:
    """The content and the ``change`` record of the version this run commits. Pure.

    An append's content is the base's shards followed by this run's (merge_appended), and its
    change says how many examples each split gained; a label-id change is this version's own and
    is never carried to the next."""
    change: dict[str, Any] = {"kind": change_kind, "run": run}
    if summary.get("label_ids_changed"):
        change["label_ids"] = summary["label_ids_changed"]
    if base is not None:
        change["added"] = {split: facts["num_examples"] for split, facts in info["splits"].items()}
        info = merge_appended(base, info, changes=summary.get("append"))
    return info, change


def _dead_letters_by_reason(dead_parts: list[dict]) -> collections.Counter[str]:
    """The run's dead letters per reason, summed over the facts of its parts. Pure."""
    by_reason: collections.Counter[str] = collections.Counter()
    for part in sorted(dead_parts, key=lambda p: p["part"]):
        by_reason.update(part["by_reason"])
    return by_reason


def _concatenate_dead_letters(folder: str, dead_parts: list[dict], dead_letters_path: str) -> None:
    """Writes the run's dead_letters.jsonl from its parts, in part order, then deletes the parts."""
    parts = sorted(dead_parts, key=lambda p: p["part"])
    part_paths = [FileSystems.join(folder, part_file_name(p["part"])) for p in parts]
    concatenate_atomically(dead_letters_path, part_paths)
    # The parts are all in the file just written; left behind they would be litter (on an
    # object store, for good) and nothing reads them again.
    delete_exactly(part_paths)


def _discard_empty_append(
    folder: str, results: list[ShardResult], *, expected: Current, num_dead: int, dead_letters_path: str
) -> None:
    """An append that made no new example commits nothing: a version equal to the current one
    would only be noise (a nightly append over a folder with one bad file would commit one every
    night). Its shards hold no example: left behind, they would read as an interrupted run to
    --resume and to the next run's warning. Its dead letters stay, for the user to read."""
    delete_exactly([FileSystems.join(folder, name) for r in results for name in (r.file, sidecar_name(r.file))])
    _DETAILS.info(
        "--append: no new example; version %s stays current%s",
        expected.version,
        f" ({num_dead} dead letters in {dead_letters_path})" if num_dead else "",
    )


def _refuse_unusable_run(
    results: list[ShardResult],
    by_reason: collections.Counter[str],
    *,
    unusable: int,
    considered: int,
    max_bad_fraction: float,
    folder: str,
    dead_letters_path: str,
    expected: Current,
    appending: bool,
) -> None:
    """Raises TooManyBadInputsError when more inputs were unusable than ``max_bad_fraction``
    allows, or when a new dataset would hold no example at all (never what a user wants, whatever
    --max_bad_fraction allows). The message says what stays as it was, and what to fix."""
    empty = not any(result.num_examples for result in results) and not appending
    if not (empty or (considered and unusable / considered > max_bad_fraction)):
        return
    kept = _kept_message(results, folder=folder, expected=expected)
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


def _kept_message(results: list[ShardResult], *, folder: str, expected: Current) -> str:
    """What a refused run leaves as it was (the current version, or no dataset) and where its
    shards stay for a --resume. Pure."""
    kept = (
        f"version {expected.version} of the dataset stays current, unchanged"
        if expected.manifest
        else "no dataset_info.json was written"
    )
    # A shard none of whose inputs became an example has no file, only its sidecar (the record
    # that --resume reuses): not a shard the user would find in the folder.
    written = [result for result in results if result.num_examples]
    if written:
        kept += (
            f"; the {len(written)} shard{'s' if len(written) != 1 else ''} converted so far "
            f"{'stays' if len(written) == 1 else 'stay'} in {folder} (no version lists it), and "
            f"a rerun with --resume reuses {'it' if len(written) == 1 else 'them'}, redoing only what changed"
        )
    return kept


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
        if is_shard_or_sidecar(name) and name not in listed:
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
        # ... and the progress notes of its shards that killed workers left (shard_progress.py),
        # and its settings' record if the delete before the commit failed (run_folders.py); the
        # run's own plan file stays until the launching process has had its last look.
        listing = [meta.path for meta in list_folder(run_dir(output_dir, run))]
        delete_exactly(
            [path for path in listing if is_writer_litter(name := path.rsplit("/", 1)[-1]) or name == RUN_SETTINGS_FILE]
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

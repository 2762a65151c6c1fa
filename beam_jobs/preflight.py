"""Pre-flight: what a run may do with its inputs and output folder, decided before any pipeline runs.

A run that cannot succeed is refused here, naming the path and the fix, rather than after minutes
of converting: the inputs must exist and not contain the output, the folder must be writable and
hold nothing a run would overwrite unasked, and an append must use the settings of the version it
extends (the shard layout aside).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.config import ImageConfig
from beam_jobs.errors import UsageError
from beam_jobs.imaging.resample import ARRAY_METHODS, DEFAULT_RESAMPLE, LEGACY_RESAMPLE
from beam_jobs.listing.discover import input_list_files
from beam_jobs.paths import redact
from beam_jobs.planning.group_rules import PERCEPTUAL_HASH, PERCEPTUAL_HASHES
from beam_jobs.run_context import RunContext
from beam_jobs.storage import bucket_problem, delete_exactly, list_folder, list_tree, temp_name
from beam_jobs.writing.commit import Current, read_current
from beam_jobs.writing.convert_shards import CONVERT_THREADS
from beam_jobs.writing.finalize import (
    DATASET_INFO,
    PLAN_FILE,
    is_own_plan,
    run_fingerprint,
)
from beam_jobs.writing.run_folders import (
    RUN_SETTINGS_FILE,
    listed_runs,
    new_run_name,
    resumable_runs,
    resume_key,
    run_dir,
    run_made_for,
    run_settings,
    write_run_settings,
)
from beam_jobs.writing.run_lock import LOCK_NAME

if TYPE_CHECKING:
    from beam_jobs.spec import ConversionSpec


__all__ = [
    "PROGRESS_FILE",
    "SHARD_LAYOUT",
    "SIDECAR",
    "TEMP_FILE",
    "check_endpoint_reachable",
    "check_inputs_exist",
    "check_output_dir",
    "check_output_outside_input",
    "check_plan_file",
    "start_run",
    "with_dataset_defaults",
    "fingerprint_with_layout_of",
    "make_output_dir",
    "remove_created",
]


_LOG = logging.getLogger("beam_jobs")


def _made_with(manifest: dict) -> dict:
    """A manifest's preprocessing settings; one written before --resample existed was made with
    its only resampling (the same bytes as --resample bicubic now)."""
    return {"resample": LEGACY_RESAMPLE, **(manifest.get("preprocessing") or {})}


# The settings that say how examples are cut into shards, not what an example is: an append
# writes its new examples in shards of its own, so it may give other values than the version's.
SHARD_LAYOUT = ("num_shards", "target_shard_mb")


def fingerprint_with_layout_of(manifest: dict | None, config: ImageConfig, settings: dict) -> str | None:
    """This run's fingerprint had it the shard layout of ``manifest``'s run: what --append compares
    with the manifest's own, so that --num_shards or --target_shard_mb never refuse an append.
    None when there is no manifest, or it records no settings (an older format: compared as is)."""
    made = (manifest or {}).get("preprocessing")
    if not made:
        return None
    return run_fingerprint(config, {**settings, **{k: made.get(k) for k in SHARD_LAYOUT if k in settings}})


def _differences(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k} {old.get(k)!r} there, {new.get(k)!r} now" for k in keys[:6]) or "an older format"


def check_endpoint_reachable(options: PipelineOptions, uris: Sequence[str], *, timeout: float = 5.0) -> None:
    """Fails in seconds when --s3_endpoint_url refuses connections (a wrong port, a stopped server).

    Beam's S3 client retries a refused connection with backoff for minutes before it reports
    it, and a refused connection is never transient enough to wait for.
    """
    if not any(str(uri).lower().startswith("s3://") for uri in uris):
        return
    endpoint = options.get_all_options().get("s3_endpoint_url")
    if not endpoint:
        return
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            pass
    except (OSError, ValueError) as error:
        why = (
            "connection refused"
            if isinstance(error, ConnectionRefusedError)
            else (
                f"no answer in {timeout:g} s" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            )
        )
        raise UsageError(f"cannot reach --s3_endpoint_url {redact(endpoint)}: {why}") from None


def check_inputs_exist(spec: ConversionSpec) -> None:
    """Fails before anything is created when the input cannot be what the flag says it is."""
    if spec.source.input_list is not None:
        path = spec.source.input_list
        if "://" not in path and os.path.isdir(path):
            raise UsageError(
                f"--manifest {path} is a folder; --manifest takes a CSV or JSONL file listing "
                "the images (for a class-per-folder tree use --input)"
            )
        if not input_list_files(path):
            raise UsageError(f"--manifest {redact(path)} does not exist (nor does any file match it)")
        return
    for _, coco in spec.source.coco_files:
        if not FileSystems.exists(coco):
            raise UsageError(f"--coco_annotations {redact(coco)} does not exist")
    root = spec.source.root
    if root is None:  # rows: a pipeline hands them over, there is nothing to look for
        return
    if "://" not in root:
        if os.path.isfile(root):
            raise UsageError(
                f"--input {root} is a file; --input takes the root folder of a class-per-folder "
                "tree (ROOT/<label>/<image>); for a CSV or JSONL list of images use --manifest"
            )
        if not os.path.isdir(root):
            raise UsageError(f"--input {root} does not exist")
    elif not list_tree(root, limit=1):
        problem = bucket_problem(root)
        raise UsageError(f"--input {redact(root)}: {problem or 'no files found under it'}")


def check_output_outside_input(spec: ConversionSpec) -> None:
    """Refuses an --output_dir equal to or inside the --input tree: the dataset would be written
    among the images, and a later run would list the output folder as one more class. An input
    list (or a COCO file) names its images one by one, so its output may be anywhere."""
    given_root = spec.source.root
    if given_root is None or spec.source.coco_files:
        return
    root, output = given_root, spec.output_dir
    if "://" not in root and "://" not in output:
        root, output = os.path.realpath(root), os.path.realpath(output)
    root, output = root.rstrip("/") + "/", output.rstrip("/") + "/"
    if output.startswith(root):
        where = "is" if output == root else "lies inside"
        raise UsageError(
            f"--output_dir {redact(spec.output_dir)} {where} the --input tree "
            f"{redact(given_root)}; the dataset would be mixed with the images (and read as "
            "a class by the next run): choose an output folder outside it"
        )


def make_output_dir(output_dir: str) -> list[str]:
    """Creates --output_dir (and its missing parents) and proves it writable; returns the folders
    it created, deepest first, so that a run that fails at once can remove them again."""
    created = []
    if "://" not in output_dir:
        if os.path.exists(output_dir) and not os.path.isdir(output_dir):
            raise UsageError(f"--output_dir {output_dir} is a file, not a folder")
        folder = os.path.abspath(output_dir)  # a relative path: its parents end at the working directory, not at ""
        while not os.path.exists(folder):
            created.append(folder)
            folder = os.path.dirname(folder)
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise UsageError(f"--output_dir {output_dir} lies under {folder}, which is a file")
    try:
        if not FileSystems.exists(output_dir):
            FileSystems.mkdirs(output_dir)
        # Fail now, with a clear message, rather than after converting everything.
        _probe_writable(output_dir)
    except Exception as error:
        remove_created(created)
        raise UsageError(f"cannot write to --output_dir {redact(output_dir)}: {redact(str(error))}") from None
    return created


def _probe_writable(output_dir: str) -> None:
    """Writes and deletes a small object, removing it whatever happens in between.

    On an object store the probe is an object in the user's bucket: a failure (or an interrupt)
    after the write must not leave it behind. A store that accepts the write but refuses the
    delete gets an error naming the object, since the job could not clean up its temp files
    there either.
    """
    probe = FileSystems.join(output_dir, temp_name("probe"))
    try:
        # Not empty: Beam's S3 writer cannot write a zero-byte object (see storage._create_empty),
        # and the probe should take the path every shard takes.
        with FileSystems.create(probe) as handle:
            handle.write(b"images-to-tfrecords write probe\n")
    except BaseException:
        try:  # A write that failed late (or was interrupted) may still have created the object.
            if FileSystems.exists(probe):
                delete_exactly([probe])
        except Exception:  # The write's own error is the one to report.
            pass
        raise
    try:
        delete_exactly([probe])
    except Exception as error:
        if not _still_there(probe):
            # Gone already: another run of this folder, holding its lock while this one waits for
            # it, removed it as a killed run's leftover (check_output_dir). The write was the test.
            return
        raise OSError(
            f"wrote {probe} but could not delete it ({error}); the job deletes its temp files "
            "as it goes, so it needs delete permission there (remove that object by hand)"
        ) from None


def _still_there(path: str) -> bool:
    """Whether ``path`` exists, True when that cannot be told (the delete's error then stands)."""
    try:
        return FileSystems.exists(path)
    except Exception:  # pylint: disable=broad-except
        return True


# This run's progress file (shard_progress.progress_file_name); only this run's exists while it holds the lock
# and finalize has not yet removed those of killed runs.
PROGRESS_FILE = re.compile(r"^\.progress-.+\.json$")
# Any file being written (storage.temp_name): a killed writer's leftover once no writer is alive.
TEMP_FILE = re.compile(r"^\.tmp-[0-9a-f]{32}-")
# The output probe's and the lock's temp names (storage.temp_name): a killed run's leftovers.
# A shard's sidecar in its run folder (convert.sidecar_name): counted after an interrupt.
SIDECAR = re.compile(r"^\..+\.tfrecord\.json$")
_RUN_TEMP_FILE = re.compile(r"^\.tmp-[0-9a-f]{32}-(probe|" + re.escape(LOCK_NAME) + r")$")


def check_output_dir(
    output_dir: str,
    current: Current,
    *,
    overwrite: bool,
    resume: bool,
    fingerprint: str,
    preprocessing: dict,
    append: bool = False,
    append_fingerprint: str | None = None,
) -> tuple[str, str]:
    """Decides what this run may do with the folder; returns (its run name, its change kind).

    A run writes only into its own folder under shards/ and commits by one write of
    dataset_info.json (commit.py), so no flag ever deletes or replaces a file up front, and files
    of the user's that look like the job's (a "train-00000-of-00001.tfrecord" of their own) are
    simply left beside the dataset.

    - a folder holding a dataset: refused without a flag that says what to do with it;
    - --overwrite: the run commits a new version holding only its own shards; the one it replaces
      stays whole (kept for the retention window, see `versions gc`);
    - --resume: continues the newest uncommitted run folder whose shards were made with the same
      settings (each shard is verified later against its sidecar and its sources); with a dataset
      of other settings there, only with --overwrite.
    """
    _remove_temp_files_of_killed_runs(output_dir)
    _refuse_what_the_flags_do_not_say(
        output_dir,
        current,
        overwrite=overwrite,
        resume=resume,
        append=append,
        fingerprint=fingerprint,
        append_fingerprint=append_fingerprint,
        preprocessing=preprocessing,
    )
    previous = current.manifest
    kind = "create" if previous is None else "append" if append else "overwrite"
    if previous is not None and not append:
        _LOG.info(
            "version %s in %s stays current until this run commits the next one",
            current.version,
            redact(output_dir),
        )
    committed = listed_runs(_committed_manifests(output_dir, current))
    # An append's shards hold only what the version lacks: its folder is continued only by an
    # append to the same version, and an overwrite's only by a run that converts every input.
    own = resume_key(fingerprint, run_made_for(current.version if append else None))
    if not resume:
        _warn_of_continuable_runs(output_dir, committed, own, append=append)
        return new_run_name(), kind
    return _resumed_run(output_dir, current, committed, own, preprocessing, append=append), kind


def _remove_temp_files_of_killed_runs(output_dir: str) -> None:
    """A probe or lock temp file is never data: a run killed (SIGKILL, which runs no cleanup)
    between writing and renaming or deleting it leaves it. This run holds the lock, so no live
    run is writing one."""
    names = {m.path.rsplit("/", 1)[-1]: m.path for m in list_folder(output_dir)}
    leftovers = sorted(name for name in names if _RUN_TEMP_FILE.match(name))
    if leftovers:
        _LOG.info(
            "removing %d temp file(s) of a killed run from %s: %s",
            len(leftovers),
            redact(output_dir),
            ", ".join(leftovers),
        )
        delete_exactly([names[name] for name in leftovers])


def _refuse_what_the_flags_do_not_say(
    output_dir: str,
    current: Current,
    *,
    overwrite: bool,
    resume: bool,
    append: bool,
    fingerprint: str,
    append_fingerprint: str | None,
    preprocessing: dict,
) -> None:
    """A UsageError, before any work, for a folder whose dataset the flags say nothing about (or
    the wrong thing: an append or a resume with other settings)."""
    previous = current.manifest
    if append:
        if previous is None:
            raise UsageError(
                f"--append: --output_dir {redact(output_dir)} holds no dataset to append to (no "
                f"{DATASET_INFO}); run without --append to create one"
            )
        if previous.get("fingerprint") not in (fingerprint, append_fingerprint):
            changed = _differences(
                {k: v for k, v in _made_with(previous).items() if k not in SHARD_LAYOUT},
                {k: v for k, v in preprocessing.items() if k not in SHARD_LAYOUT},
            )
            raise UsageError(
                f"--append: version {current.version} in {redact(output_dir)} was made with other settings "
                f"({changed}); an append takes the same flags as the run that made the dataset, so that "
                "its examples stay alike (the shard count and size may differ)"
            )
    if previous is not None and not (overwrite or resume or append):
        raise UsageError(
            f"--output_dir {redact(output_dir)} already holds a dataset (version {current.version}, {DATASET_INFO}); "
            "pass --overwrite to replace it with a new version (the current one stays readable until a later "
            "commit removes it), --resume to continue an interrupted run with the same flags, or choose another "
            "folder"
        )
    if previous is not None and resume and not overwrite and previous.get("fingerprint") != fingerprint:
        raise UsageError(
            f"--output_dir {redact(output_dir)} holds a dataset made with other settings "
            f"({_differences(_made_with(previous), preprocessing)}); --resume only continues a run "
            "with the same flags. Pass --overwrite to replace it, or choose another folder"
        )


def _warn_of_continuable_runs(output_dir: str, committed: set[str], own: str, *, append: bool) -> None:
    """Said before the work, not after: an earlier run's shards that --resume would keep are
    removed once this run commits."""
    if any(_continuable(found, own) for _, found in resumable_runs(output_dir, committed)):
        _LOG.warning(
            "an interrupted earlier run in %s left shards made with these same settings; this run "
            "converts %s again and removes them when it commits (stop it now and rerun "
            "with --resume to keep them)",
            redact(output_dir),
            "its new inputs" if append else "everything",
        )


def _resumed_run(
    output_dir: str, current: Current, committed: set[str], own: str, preprocessing: dict, *, append: bool
) -> str:
    """--resume: the newest uncommitted run folder with shards made with these settings, else a
    new run's name, with a warning that says why nothing is continued."""
    unkept, differences, unstaged = 0, set[str](), None
    for run, found in resumable_runs(output_dir, committed):
        if _continuable(found, own):
            _LOG.info("--resume: continuing the run in %s", redact(run_dir(output_dir, run)))
            return run
        if not found and unstaged is None and RUN_SETTINGS_FILE in _names_in(run_dir(output_dir, run)):
            unstaged = run  # stopped before its first shard: its record named this run's settings
        if found:
            unkept += 1
            differences.update(
                _purpose_difference(key, own) or f"made with other settings: {_differences(settings, preprocessing)}"
                for key, settings in found.items()
                if key not in (own, None)
            )
    if unkept:
        _LOG.warning(
            "--resume: the shards of %d earlier run%s in %s are not kept (%s); this run converts %s again "
            "with the flags given now",
            unkept,
            "" if unkept == 1 else "s",
            redact(output_dir),
            "; ".join(sorted(differences)),
            "its new inputs" if append else "everything",
        )
    elif unstaged is not None:
        _LOG.warning(
            "--resume: the interrupted run in %s stopped before its first shard; this run converts %s "
            "(resample %s) and commits the next version",
            redact(run_dir(output_dir, unstaged)),
            "the new inputs" if append else "everything",
            preprocessing.get("resample"),
        )
    elif current.manifest is not None and not append:
        # Said by default (the notice above is INFO): the user asked to finish a run, and this one
        # will replace a complete dataset instead.
        _LOG.warning(
            "--resume: %s holds no interrupted run to continue, and its version %s is complete; this run "
            "converts everything again and commits the next version (stop it now if that is not what you want)",
            redact(output_dir),
            current.version,
        )
    return new_run_name()


def _names_in(folder: str) -> set[str]:
    try:
        return {meta.path.rsplit("/", 1)[-1] for meta in list_folder(folder)}
    except Exception:  # pylint: disable=broad-exception-caught  # gone: nothing in it
        return set()


def _purpose_difference(key: str, own: str) -> str:
    """How a run folder's shards were made for another purpose than this run's, with the same
    settings ("" when the settings differ: `_differences` says how)."""
    theirs, _, their_purpose = key.partition("|")
    ours, _, our_purpose = own.partition("|")
    if theirs != ours:
        return ""

    def said(purpose: str) -> str:
        return f"an --append to version {purpose.split(':', 1)[1]}" if purpose else "a run of every input"

    return f"made for {said(their_purpose)}, not {said(our_purpose)}"


def _continuable(found: dict, fingerprint: str) -> bool:
    """Whether --resume continues a run folder whose sidecars record the fingerprints ``found``:
    it has shards, and all were made with this run's settings (None: a sidecar older than them)."""
    return bool(found) and set(found) <= {fingerprint, None}


def _committed_manifests(output_dir: str, current: Current) -> list[dict]:
    """The current manifest and the history's: what lists the run folders a --resume must not reuse."""
    try:
        from beam_jobs.versions import history  # pylint: disable=import-outside-toplevel  # cycle

        return history(output_dir)
    except Exception:  # An unreadable history: the current version's folders, at least, stay untouched.
        return [current.manifest] if current.manifest else []


def check_plan_file(output_dir: str) -> None:
    """--plan_only replaces its own earlier plan.json, never a file of the user's of that name."""
    path = FileSystems.join(output_dir, PLAN_FILE)
    if FileSystems.exists(path) and not is_own_plan(path):
        raise UsageError(
            f"--output_dir {redact(output_dir)} holds a {PLAN_FILE} that this job did not write "
            f"({redact(path)}); --plan_only would replace it: move it, or choose another folder"
        )


def remove_created(folders: list[str]) -> None:
    """Removes the folders this run created, deepest first, as long as they are empty."""
    for folder in folders:
        try:
            if "://" not in folder:
                os.rmdir(folder)
        except OSError:  # Not empty (or gone): it holds something worth keeping.
            return


def with_dataset_defaults(spec: ConversionSpec) -> ConversionSpec:
    """The spec with the settings it leaves to the folder made concrete: without a chosen
    resampling, a run that continues a dataset keeps the one the dataset was made with (--append:
    the current version's; --resume: the newest interrupted run folder's, else the current
    version's), so that a dataset made before the default changed still resumes and appends byte
    for byte; any other run takes the default of new datasets. A grey dataset made before its
    grey came from the luma plane keeps Pillow's grey (ImageConfig.grey_decode), and the
    near-copy signature is kept the same way (a dataset made with
    group_rules.LEGACY_PERCEPTUAL_HASH compares without tone).

    Called once, under the output lock, before start_run, by every entry point (run.run_spec,
    ConvertImages): the fingerprints, the manifest and the workers then all see the one method."""
    continues = (spec.mode.append or spec.mode.resume) and not spec.mode.plan_only
    made = _dataset_made_with(spec) if continues else []
    method = spec.image.resample or (made[0]["resample"] if made else DEFAULT_RESAMPLE)
    if spec.image.resample is None and method != DEFAULT_RESAMPLE:
        _LOG.info(
            "resampling with %r, the method %s was made with (--resample chooses another)",
            method,
            redact(spec.output_dir),
        )
    spec = spec.replace(image=dataclasses.replace(spec.image, resample=method))
    if spec.image.grey_decode is None and made and _made_with_pillows_grey(made[0]):
        spec = spec.replace(image=dataclasses.replace(spec.image, grey_decode="pillow"))
    signature = ((made[0].get("split_groups") or {}).get("method") if made else None) or None
    if spec.splits.groups == "near_copies" and signature in PERCEPTUAL_HASHES and signature != PERCEPTUAL_HASH:
        _LOG.info("near-copy signatures by %r, the method %s was made with", signature, redact(spec.output_dir))
        spec = spec.replace(splits=dataclasses.replace(spec.splits, near_copy_method=signature))
    return spec


def _made_with_pillows_grey(settings: dict) -> bool:
    """Whether settings are those of a grey dataset made with an array resampling before its grey
    came from the luma plane: one made since records grey_decode, and one in colour or with a
    Pillow resampling never had a luma plane to take (ImageConfig.to_json). Pure."""
    return settings.get("channels") == 1 and settings.get("resample") in ARRAY_METHODS and "grey_decode" not in settings


def _dataset_made_with(spec: ConversionSpec) -> list[dict]:
    """The settings of what a continuing run continues, the first the one it takes after: the
    newest interrupted run folder (--resume alone), then the current version."""
    current = read_current(spec.output_dir)
    made = [_made_with(current.manifest)] if current.manifest is not None else []
    if spec.mode.resume and not spec.mode.append:
        committed = listed_runs(_committed_manifests(spec.output_dir, current))
        for run, found in resumable_runs(spec.output_dir, committed):
            # Its sidecars' settings (a sidecar that names them), else what it recorded at its start.
            named = [settings for key, settings in found.items() if key is not None]
            recorded = named[0] if named else _recorded_settings(spec.output_dir, run)
            if recorded is not None:
                return [{"resample": LEGACY_RESAMPLE, **recorded}, *made]
    return made


def _recorded_settings(output_dir: str, run: str) -> dict | None:
    """The settings an interrupted run recorded as it started (run_folders.run_settings), or None,
    with a warning when its record is there but unusable (not JSON, not settings, or a resampling
    this job does not have): a hand-edited or damaged record never chooses the settings."""
    try:
        settings = run_settings(output_dir, run)
    except ValueError as error:
        _LOG.warning(
            "--resume: ignoring the settings record %s of an interrupted run (%s)",
            redact(FileSystems.join(run_dir(output_dir, run), RUN_SETTINGS_FILE)),
            error,
        )
        return None
    return settings


def start_run(spec: ConversionSpec) -> RunContext:
    """Reads the version this run starts from (it commits only if that is still the current one)
    and checks the output folder against the run's mode: the run's name, and what it changes.

    The one decision of what a spec's RunMode does to a folder, for the command line, convert()
    and ConvertImages(spec) alike: refused over a dataset without overwrite or append, --resume
    continuing the newest run folder of the same settings, an append needing a dataset."""
    output_dir = spec.output_dir
    current = read_current(output_dir)
    if spec.mode.plan_only:  # A plan only writes plan.json, beside whatever is there.
        check_plan_file(output_dir)
        return RunContext(run_id=None, expected=current, change_kind="create")
    settings = spec.settings
    run_id, kind = check_output_dir(
        output_dir,
        current,
        overwrite=spec.mode.overwrite,
        resume=spec.mode.resume,
        fingerprint=run_fingerprint(spec.image, settings),
        preprocessing={**spec.image.to_json(), **settings},
        append=spec.mode.append,
        append_fingerprint=fingerprint_with_layout_of(current.manifest, spec.image, settings),
    )
    if kind == "create" and current.manifest is not None:
        kind = "overwrite"
    write_run_settings(output_dir, run_id, {**spec.image.to_json(), **settings})
    return RunContext(run_id=run_id, expected=current, change_kind=kind, convert_threads=CONVERT_THREADS)

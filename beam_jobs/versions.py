"""A dataset folder's versions: history, reading an older one, rolling back, and collecting garbage.

Also a command line: ``python -m beam_jobs.versions DATA_DIR list | rollback N | gc [--keep K] |
files [--version N] [--split S]``.

Every version's manifest stays in OUT/versions/ (small); its data files stay until ``gc`` drops
the versions outside the retention window. ``gc`` and ``rollback`` take the folder's run lock, so
they never race a conversion writing into the same folder.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import sys
from collections.abc import Iterable, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import JobError
from beam_jobs.planning.rules import label_id_changes
from beam_jobs.storage import delete_exactly, list_tree
from beam_jobs.writing.commit import (
    VERSION_KEYS,
    VERSIONS_DIR,
    CommitConflictError,
    _parse,
    _store,
    commit_version,
    read_current,
    version_file,
)
from beam_jobs.writing.run_folders import SHARDS_DIR, run_of
from beam_jobs.writing.run_lock import OutputLockedError, acquire_output_lock, release_output_lock

__all__ = [
    "DEFAULT_KEEP",
    "VersionNotFoundError",
    "collect_garbage",
    "history",
    "kept_versions",
    "listed_files",
    "load_version",
    "main",
    "rollback",
    "shard_files",
]

DEFAULT_KEEP = 2


class VersionNotFoundError(JobError):
    """The version asked for is not kept (or the folder holds no dataset); names those that are."""


# --- Pure logic over manifests ---------------------------------------------------------------


def _safe_relative(name: object) -> str | None:
    """``name`` if it is a relative POSIX path inside OUT, else None: a manifest entry that could
    name a file outside the dataset folder is never opened, kept or deleted because of it."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "://" in name:
        return None
    if any(part in ("", ".", "..") for part in name.split("/")):
        return None
    return name


def _with_version(manifest: dict) -> dict:
    """A manifest of an older release (no ``version``) is version 1, with no parent."""
    return {"version": 1, "parent_version": None, **manifest}


def shard_files(manifest: dict, split: str | None = None) -> list[str]:
    """The shard files a manifest lists (of one split, or all), relative to OUT, in manifest order."""
    splits = manifest.get("splits") or {}
    if split is not None and split not in splits:
        raise VersionNotFoundError(
            f"version {manifest.get('version', 1)} has no split {split!r}; it has {', '.join(sorted(splits)) or 'none'}"
        )
    names = []
    for name, facts in splits.items():
        if split is None or name == split:
            names += [f for f in (_safe_relative(s.get("file")) for s in facts.get("shards", [])) if f]
    return names


def _sidecars(shard: str) -> list[str]:
    """The per-shard sidecars a shard may have beside it: ``.NAME.json`` (a run folder) and
    ``.staged-NAME.json`` (the flat layout of older releases)."""
    folder, name = posixpath.split(shard)
    return [posixpath.join(folder, f".{name}.json"), posixpath.join(folder, f".staged-{name}.json")]


def listed_files(manifest: dict) -> set[str]:
    """Every file a version owns, relative to OUT: its shards, their sidecars, its dead letters."""
    files = set()
    for shard in shard_files(manifest):
        files.add(shard)
        files.update(_sidecars(shard))
    dead = _safe_relative(manifest.get("dead_letters_file"))
    if dead:
        files.add(dead)
    return files


def _shard_sizes(manifest: dict) -> dict[str, int | None]:
    return {
        f: s.get("bytes")
        for facts in (manifest.get("splits") or {}).values()
        for s in facts.get("shards", [])
        if (f := _safe_relative(s.get("file")))
    }


# What a run writes into its folder (run_folders.py): shards, their sidecars, its dead letters and
# their parts, its progress file, and temp files. gc removes nothing else from a run folder.
_RUN_FILE = re.compile(
    r"^(?:[^/]+-\d{5}-of-\d{5}\.tfrecord|\.[^/]+-\d{5}-of-\d{5}\.tfrecord\.json|dead_letters\.jsonl"
    r"|\.staged-dead_letters-\d{5}-of-\d{5}\.jsonl|\.progress-[^/]+\.json|\.tmp-[0-9a-f]{32}-[^/]+)$"
)


def _run_of(relative: str) -> str | None:
    """The run folder of a file a run of this job writes (shards/<run>/<one of its names>), or
    None: a folder under shards/ not named like a run, a file not named like a run's, or anything
    deeper, is the user's, and gc never removes it."""
    run = run_of(relative)
    return run if run is not None and _RUN_FILE.match(posixpath.basename(relative)) else None


def garbage(
    chain: Sequence[dict],
    others: Iterable[dict],
    existing: dict[str, int],
    keep: int,
    *,
    protected_runs: Iterable[str] = (),
) -> list[str]:
    """What gc deletes, relative to OUT. Pure.

    ``chain`` is the history, newest first; ``others`` any other manifest of ours (versions/ files
    off the chain); ``existing`` {relative path: size} of the files now in OUT. Deleted: files a
    version outside the window lists and no kept version does (a shard outside shards/ only when
    its size is still the manifest's: a file of the user's that took the name since is left), and
    every file of a run folder under shards/ that no kept version lists (a killed run's leftovers),
    except the folders in ``protected_runs``. Nothing else: not versions/, not the lock files, not
    a user's file.
    """
    kept = list(chain[:keep])
    keep_files = set().union(*(listed_files(m) for m in kept)) if kept else set()
    kept_runs = {run for f in keep_files if (run := _run_of(f))} | set(protected_runs)
    doomed = set()
    for manifest in [*chain[keep:], *others]:
        sizes = _shard_sizes(manifest)
        for name in listed_files(manifest) - keep_files:
            if name not in existing:
                continue
            if name in sizes and _run_of(name) is None and sizes[name] not in (None, existing[name]):
                continue
            doomed.add(name)
    for name in existing:
        run = _run_of(name)
        if run is not None and run not in kept_runs:
            doomed.add(name)
    return sorted(doomed)


# --- Reading versions ------------------------------------------------------------------------


def _read_history_file(output_dir: str, version: int) -> dict | None:
    path = FileSystems.join(output_dir, version_file(version))
    data, _ = _store(output_dir).read(path)
    return None if data is None else _with_version(_parse(path, data))


def _no_dataset(output_dir: str) -> VersionNotFoundError:
    return VersionNotFoundError(f"{output_dir} holds no dataset_info.json: no version was committed there")


def history(output_dir: str) -> list[dict]:
    """The committed versions' manifests, newest first, walking parent_version from the root.

    The root is authoritative for the current version (its copy in versions/ may be missing after
    a kill right after the commit). The walk stops where a history manifest is missing.
    """
    current = read_current(output_dir)
    if current.manifest is None:
        raise _no_dataset(output_dir)
    chain = [_with_version(current.manifest)]
    seen = {chain[0]["version"]}
    parent = chain[0].get("parent_version")
    while isinstance(parent, int) and parent not in seen:
        manifest = _read_history_file(output_dir, parent)
        if manifest is None:
            break
        chain.append(manifest)
        seen.add(parent)
        parent = manifest.get("parent_version")
    return chain


def load_version(output_dir: str, version: int | None = None) -> dict:
    """The manifest of ``version`` (None: the current one, the root dataset_info.json)."""
    current = read_current(output_dir)
    if current.manifest is None:
        raise _no_dataset(output_dir)
    if version is None or version == current.version:
        return _with_version(current.manifest)
    manifest = _read_history_file(output_dir, version) if version >= 1 else None
    if manifest is None or manifest.get("version") != version:
        kept = ", ".join(str(m["version"]) for m in history(output_dir))
        raise VersionNotFoundError(f"version {version} is not kept in {output_dir}; kept versions: {kept}")
    return manifest


def kept_versions(output_dir: str, keep: int) -> list[int]:
    """The versions inside a retention window of ``keep``: the current one and the keep-1 before it."""
    _check_keep(keep)
    return [m["version"] for m in history(output_dir)[:keep]]


def _check_keep(keep: int) -> None:
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(
            f"keep must be a whole number of at least 1 (got {keep!r}): the current version is always kept"
        )


def _existing(output_dir: str) -> dict[str, int]:
    """{path relative to OUT: size} of every file under OUT, from one listing."""
    root = output_dir.rstrip("/") + "/"
    if "://" not in output_dir:
        root = os.path.abspath(output_dir).rstrip("/") + "/"
    files = {}
    for meta in list_tree(output_dir):
        path = meta.path if "://" in meta.path else os.path.abspath(meta.path)
        if path.startswith(root):
            files[path[len(root) :]] = meta.size_in_bytes
    return files


def _off_chain_manifests(output_dir: str, chain: Sequence[dict], existing: dict[str, int]) -> list[dict]:
    """History manifests in versions/ that the walk from the root did not reach."""
    on_chain = {m["version"] for m in chain}
    others = []
    for name in existing:
        folder, _, file = name.partition("/")
        if folder == VERSIONS_DIR and file.endswith(".json") and file[:-5].isdigit() and len(file) == 13:
            version = int(file[:-5])
            if version not in on_chain and (manifest := _read_history_file(output_dir, version)):
                others.append(manifest)
    return others


def _missing_files(manifest: dict, existing: dict[str, int]) -> list[str]:
    """Files of ``manifest`` that are gone: shards (or no longer their listed size), and its dead
    letters, without which `verify` fails the version (the format says they are always present)."""
    missing = [
        f
        for f, size in _shard_sizes(manifest).items()
        if f not in existing or (size is not None and existing[f] != size)
    ]
    dead = _safe_relative(manifest.get("dead_letters_file"))
    if dead and dead not in existing:
        missing.append(dead)
    return missing


# --- Operations that change the folder (under the run lock) ----------------------------------


def collect_garbage(output_dir: str, *, keep: int = DEFAULT_KEEP, holding_run: str | None = None) -> list[str]:
    """Deletes what no version in the retention window lists (see ``garbage``); returns the paths
    deleted, relative to OUT.

    Holds the folder's run lock throughout, so no conversion writes a run folder meanwhile (a
    running one makes this raise OutputLockedError with the lock's message). A run that holds the
    lock itself and collects after its own commit passes its name as ``holding_run``: the lock is
    then not taken again (nor released), and shards/<holding_run>/ is never touched.
    """
    _check_keep(keep)
    lock = None if holding_run else acquire_output_lock(output_dir)
    try:
        chain = history(output_dir)
        existing = _existing(output_dir)
        doomed = garbage(
            chain,
            _off_chain_manifests(output_dir, chain, existing),
            existing,
            keep,
            protected_runs=[holding_run] if holding_run else [],
        )
        delete_exactly([FileSystems.join(output_dir, name) for name in doomed])
        if "://" not in output_dir:
            _remove_empty_run_folders(output_dir)
        return doomed
    finally:
        if lock is not None:
            release_output_lock(lock)


def _remove_empty_run_folders(output_dir: str) -> None:
    shards = os.path.join(output_dir, SHARDS_DIR)
    if not os.path.isdir(shards):
        return
    for folder, _, _ in sorted(os.walk(shards), key=lambda entry: -len(entry[0])):
        if folder != shards:
            try:
                os.rmdir(folder)
            except OSError:  # Not empty: something is still kept, or a file of the user's.
                pass


def rollback(output_dir: str, version: int) -> dict:
    """Commits a new version whose content is version ``version``'s (the same shard files, nothing
    copied), change kind ``rollback``. Refuses when that version's shards were collected.

    Its label ids are that version's: where they differ from the current version's (a version
    before a --relabel sorted, or one without a label added since), the change's ``label_ids``
    says how, so that a model trained on the current version is not fed other ids unwarned."""
    lock = acquire_output_lock(output_dir)
    try:
        current = read_current(output_dir)
        if current.manifest is None:
            raise _no_dataset(output_dir)
        if version == current.version:
            raise JobError(f"version {version} is already the current version of {output_dir}; nothing to roll back")
        target = load_version(output_dir, version)
        missing = _missing_files(target, _existing(output_dir))
        shards = [name for name in missing if name in _shard_sizes(target)]
        if shards:
            raise JobError(
                f"cannot roll back {output_dir} to version {version}: {len(shards)} of its "
                f"{len(_shard_sizes(target))} shard files are gone (collected by gc?), e.g. {shards[0]}; "
                "nothing was committed"
            )
        if missing:  # Its shards are there (a later version uses them), its dead letters are not.
            raise JobError(
                f"cannot roll back {output_dir} to version {version}: its dead letters ({missing[0]}) are gone "
                "(collected by gc?), and a version without them fails verify; nothing was committed"
            )
        content = {key: value for key, value in target.items() if key not in VERSION_KEYS}
        change = {"kind": "rollback", "run": None, "rolled_back_to": version}
        differences = label_id_changes(current.manifest.get("label_names", []), target.get("label_names", []))
        if differences:
            change["label_ids"] = (
                f"label ids differ: version {version}'s are not version {current.version}'s: {', '.join(differences)}"
            )
        return commit_version(output_dir, content, expected=current, change=change)
    finally:
        release_output_lock(lock)


# --- Command line ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit 2, not the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    from apache_beam.options.pipeline_options import S3Options  # pylint: disable=import-outside-toplevel

    parser = _Parser(
        prog="python -m beam_jobs.versions",
        description="Show, read back, roll back and clean up the versions of a dataset folder written by "
        "images-to-tfrecords. Every commit is a new version; the root dataset_info.json is the current one, "
        "versions/NNNNNNNN.json keeps each version's manifest.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python -m beam_jobs.versions out/ list                 versions, newest first\n"
        "  python -m beam_jobs.versions out/ files --split train  the current train shards, one a line\n"
        "  python -m beam_jobs.versions out/ rollback 3           make version 3's content current again\n"
        "  python -m beam_jobs.versions out/ gc --keep 2          drop files only older versions use\n\n"
        "gc and rollback take the folder's run lock: while a conversion writes into DATA_DIR they refuse\n"
        "with the lock's message (exit 1). Bad input exits 2 with one line. gs:// uses the usual Google\n"
        "credentials (or STORAGE_EMULATOR_HOST); s3:// takes Beam's --s3_* options after the command\n"
        "(see COMMAND --help).",
    )
    parser.add_argument("data_dir", metavar="DATA_DIR", help="the dataset folder (local path, gs:// or s3://)")
    # Beam's S3 options, accepted after the command (where a user types them).
    stores = _Parser(add_help=False)
    S3Options._add_argparse_args(stores.add_argument_group("s3:// options (Beam's)"))  # pylint: disable=protected-access
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    commands.add_parser("list", parents=[stores], help="a table of the versions, newest first; * marks the current one")
    back = commands.add_parser(
        "rollback",
        parents=[stores],
        help="commit a new version whose content is version N's (its files must still be kept)",
    )
    back.add_argument("version", metavar="N", type=_version_number, help="the version to go back to")
    gc = commands.add_parser(
        "gc",
        parents=[stores],
        help="delete the files of versions outside the retention window, and run "
        "folders no kept version lists (killed runs); never a file no manifest lists outside "
        "shards/",
    )
    gc.add_argument(
        "--keep",
        type=_version_number,
        default=DEFAULT_KEEP,
        help="versions whose files stay: the current one and the K-1 before it (default: %(default)s)",
    )
    files = commands.add_parser(
        "files",
        parents=[stores],
        help="the shard files of a version, one path per line (for tools that take file lists)",
    )
    files.add_argument("--version", type=_version_number, default=None, help="the version (default: the current one)")
    files.add_argument("--split", default=None, help="only this split's shards (default: every split)")
    return parser


def _version_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1 (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1 (got {text!r})")
    return value


def _files_state(manifest: dict, existing: dict[str, int]) -> str:
    gone = _missing_files(manifest, existing)
    total, missing = len(_shard_sizes(manifest)), len([f for f in gone if f in _shard_sizes(manifest)])
    if not gone:
        return "kept"
    if missing == total:
        return "collected"
    return f"partly collected ({missing} of {total} shards gone)" if missing else "partly collected (dead letters gone)"


def _examples(manifest: dict) -> str:
    splits = manifest.get("splits") or {}
    return ", ".join(f"{name} {facts.get('num_examples', 0)}" for name, facts in splits.items()) or "-"


def version_table(chain: Sequence[dict], existing: dict[str, int]) -> list[str]:
    """The lines `list` prints: one a version, newest first, the current one marked with *."""
    rows = [("", "version", "committed_at", "change", "examples", "files")]
    for index, manifest in enumerate(chain):
        change = manifest.get("change") or {}
        kind = change.get("kind", "-")
        if kind == "rollback" and "rolled_back_to" in change:
            kind = f"rollback to {change['rolled_back_to']}"
        rows.append(
            (
                "*" if index == 0 else "",
                str(manifest["version"]),
                manifest.get("committed_at") or "-",
                kind,
                _examples(manifest),
                _files_state(manifest, existing),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows
    ]


def _set_filesystem_options(arguments: argparse.Namespace) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=import-outside-toplevel

    s3 = {key: value for key, value in vars(arguments).items() if key.startswith("s3_") and value not in (None, False)}
    FileSystems.set_options(PipelineOptions(**s3))


def _run(arguments: argparse.Namespace) -> list[str]:
    out = arguments.data_dir
    if arguments.command == "list":
        return version_table(history(out), _existing(out))
    if arguments.command == "rollback":
        committed = rollback(out, arguments.version)
        label_ids = committed["change"].get("label_ids")
        return [
            f"version {committed['version']} committed: the content of version {arguments.version}",
            *([f"WARNING: {label_ids}"] if label_ids else []),
        ]
    if arguments.command == "gc":
        deleted = collect_garbage(out, keep=arguments.keep)
        kept = kept_versions(out, arguments.keep)
        return [
            *deleted,
            f"deleted {len(deleted)} file{'s' if len(deleted) != 1 else ''}; the files of "
            f"version{'s' if len(kept) != 1 else ''} {', '.join(map(str, kept))} are kept",
        ]
    manifest = load_version(out, arguments.version)
    names = shard_files(manifest, arguments.split)
    existing = _existing(out)
    gone = [name for name in names if name not in existing]
    if gone:
        raise JobError(
            f"version {manifest.get('version', 1)} of {out}: {len(gone)} of its {len(names)} shard files "
            f"are gone (collected by gc?), e.g. {gone[0]}; no list printed"
        )
    return [FileSystems.join(out, name) for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    """The versions command line: exit 1 when another run holds the folder or a commit lost a race, 2 for bad input."""
    arguments = _parser().parse_args(argv)
    _set_filesystem_options(arguments)
    try:
        lines = _run(arguments)
    except (OutputLockedError, CommitConflictError) as error:
        print(f"{_parser().prog}: error: {error}", file=sys.stderr)
        return 1
    except ValueError as error:  # JobError and VersionNotFoundError are ValueErrors: bad input.
        print(f"{_parser().prog}: error: {error}", file=sys.stderr)
        return 2
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:  # `list | head`: the reader has all it wanted; no traceback for that.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())

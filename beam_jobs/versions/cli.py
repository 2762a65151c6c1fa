"""The versions command line: ``python -m beam_jobs.versions DATA_DIR list | rollback N |
gc [--keep K] | files [--version N] [--split S]``. Exit 1 when another run holds the folder or a
commit lost a race, 2 for bad input, each with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import JobError
from beam_jobs.versions.garbage import DEFAULT_KEEP, collect_garbage
from beam_jobs.versions.manifests import _missing_files, _shard_sizes, shard_files
from beam_jobs.versions.reading import _existing, history, kept_versions, load_version
from beam_jobs.versions.rollbacks import rollback
from beam_jobs.writing.commit import (
    CommitConflictError,
)
from beam_jobs.writing.run_lock import OutputLockedError


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

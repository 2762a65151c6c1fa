"""The verify command's arguments and entry point, parsed before TensorFlow is imported, so that
--help and a bad flag answer at once.

Its own module, not ``tfdata_readers/verify.py``: importing that submodule would set the
package's ``verify`` attribute (the function) to the module.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tfdata_readers._command_parser import CommandParser
from tfdata_readers._quiet_start import import_tensorflow_for_command

__all__ = ["main", "parser"]

PROG = "verify-tfrecords"


def _version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text!r})")
    return value


def parser() -> argparse.ArgumentParser:
    """The command's arguments (no TensorFlow needed to build or print them)."""
    built = CommandParser(
        prog=PROG,
        description="Check a converted dataset's shards against its dataset_info.json. Exits 1 on any problem.",
        epilog="examples:\n  verify-tfrecords tfrecords/\n  verify-tfrecords gs://bucket/tfrecords --split train "
        "--version 3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    built.add_argument("data_dir", help="directory (or gs:// URI) holding dataset_info.json")
    built.add_argument("--split", action="append", help="split to check (repeatable); default: all")
    built.add_argument(
        "--version",
        type=_version,
        default=None,
        help="dataset version to check (an int >= 1); default: the current one",
    )
    built.add_argument(
        "--leakage",
        action="store_true",
        help="also report near-copies in different splits (by the perceptual signatures the job stored "
        "with --split_groups near_copies, or else computed from the stored images); exits 1 if any",
    )
    built.add_argument(
        "--near_copy_bits",
        type=_near_copy_bits,
        default=None,
        help="with --leakage: the threshold to check at, 0-24 (default: the one the dataset was made with, else "
        "14); a dataset made with a small one can be checked at the default",
    )
    return built


def _near_copy_bits(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bits") from None
    if not 0 <= value <= 24:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 24 bits")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The verify command: parses the arguments first, then imports TensorFlow and checks; returns the exit status."""
    args = parser().parse_args(argv)
    import_tensorflow_for_command(PROG)
    from tfdata_readers.checking.verification import verify_command  # pylint: disable=import-outside-toplevel

    if args.near_copy_bits is not None and not args.leakage:
        parser().error("--near_copy_bits only applies with --leakage")
    return verify_command(
        args.data_dir, splits=args.split, version=args.version, leakage=args.leakage, near_copy_bits=args.near_copy_bits
    )

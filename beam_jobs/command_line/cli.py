"""The ``images-to-tfrecords`` command: --help and misspelt flags answered before Beam is imported.

Importing Beam takes a second on a quiet machine and ten on a busy one; a user who types --help
or misspells a flag should not wait for it. Everything else goes to pipeline.main, which parses
the whole command line again with Beam's own parser and checks every value.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from importlib import metadata

from beam_jobs.command_line.beam_flags import BEAM_OPTION_STRINGS, BEAM_VERSION
from beam_jobs.command_line.flags import PROG, help_parser, unknown_flag_message
from beam_jobs.paths import redact

__all__ = ["main", "misspelt_flag"]


def _installed_beam_version() -> str | None:
    try:
        return metadata.version("apache-beam")
    except metadata.PackageNotFoundError:
        return None


def misspelt_flag(argv: Sequence[str]) -> str | None:
    """The error for the first ``--flag`` that neither the job nor Beam knows, or None.

    Only for the Beam release whose flags beam_flags.py lists: with another, any flag might be
    one of its own, and the full parse (which imports Beam) decides. Anything subtler than an
    unknown flag name (a missing value, a bad one) is left to the full parse too.
    """
    if _installed_beam_version() != BEAM_VERSION:
        return None
    ours = {option for action in help_parser()._actions for option in action.option_strings}  # pylint: disable=protected-access
    known = ours | BEAM_OPTION_STRINGS
    for token in argv:
        if token == "--":
            return None
        if token.startswith("--") and token.split("=", 1)[0] not in known:
            return unknown_flag_message(token, known)
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point (see pipeline.main for the exit codes). As the program (no ``argv``
    given), a finished run's process exits without collecting its heap."""
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
    if "--version" in argv:
        help_parser().parse_args(["--version"])  # prints "images-to-tfrecords <version>" and exits 0
    problem = misspelt_flag(argv)
    if problem is not None:
        print(f"{PROG}: error: {redact(problem)}", file=sys.stderr)
        raise SystemExit(2)
    from beam_jobs.pipeline import main as run_job  # pylint: disable=import-outside-toplevel

    run_job(argv)
    if as_program:
        # The run is over: what is left is the interpreter's exit, whose garbage collections walk
        # a heap of Beam, gRPC and codec objects (0.4-0.5 s on 2 cores) that nothing needs
        # collected. Frozen, they are out of the collector's sight; the exit still joins threads
        # and runs exit handlers as usual (local_worker.py does the same in each worker).
        gc.freeze()


if __name__ == "__main__":
    main()

"""The ``images-to-tfrecords`` command: --help and misspelt flags answered before Beam is imported.

Importing Beam takes a second on a quiet machine and ten on a busy one; a user who types --help
or misspells a flag should not wait for it. Everything else goes to pipeline.main, which parses
the whole command line again with Beam's own parser and checks every value.

This module imports nothing heavy at its top (the flags bring NumPy and Pillow): the command's
SIGTERM handler is installed first thing in main, and the console script imports this module
before it calls main.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from beam_jobs.command_line.termination import interrupted_outside_the_run_line, sigterm_ends_the_command

if TYPE_CHECKING:
    from beam_jobs.warm_workers import WarmWorkers

__all__ = ["main", "misspelt_flag"]


def _installed_beam_version() -> str | None:
    from importlib import metadata  # pylint: disable=import-outside-toplevel  # 0.1 s: after the SIGTERM handler

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
    from beam_jobs.command_line.beam_flags import BEAM_OPTION_STRINGS, BEAM_VERSION  # pylint: disable=import-outside-toplevel
    from beam_jobs.command_line.flags import help_parser, unknown_flag_message  # pylint: disable=import-outside-toplevel
    from beam_jobs.command_line.job_server_flags import (  # pylint: disable=import-outside-toplevel
        job_server_option_strings,
        other_runners_flag,
        runner_ambiguous,
        runner_option_error,
    )

    if _installed_beam_version() != BEAM_VERSION:
        return None
    if runner_ambiguous(argv):
        return None  # the full parse refuses a --runner given twice or blank
    misread = runner_option_error(argv)
    if misread:
        return misread
    ours = {option for action in help_parser()._actions for option in action.option_strings}  # pylint: disable=protected-access
    known = ours | BEAM_OPTION_STRINGS | job_server_option_strings(argv)
    for token in argv:
        if token == "--":
            return None
        name = token.split("=", 1)[0]
        if token.startswith("--") and name not in known:
            return other_runners_flag(name, argv) or unknown_flag_message(token, known)
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point (see pipeline.main for the exit codes). As the program (no ``argv``
    given), SIGTERM gets its one line and exit 143 from this function's first line to the
    process's exit (see _exit_as_the_interpreter_would)."""
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not as_program:
        _run_command(argv)
        return
    sigterm_ends_the_command(argv)  # First: a SIGTERM during the imports that follow ends the run with its line, too.
    try:
        _run_command(argv, warm=True)
    except SystemExit as ending:
        _exit_as_the_interpreter_would(ending.code)
    except KeyboardInterrupt:  # Ctrl-C outside the guarded run (in the imports before it): its line, no traceback
        print(interrupted_outside_the_run_line(), file=sys.stderr)
        _exit_as_the_interpreter_would(130)
    _exit_as_the_interpreter_would(0)


def _start_warm_workers(argv: Sequence[str]) -> WarmWorkers | None:
    """The local runner's workers, started now so that their imports overlap the job's own
    (warm_workers.py): one a core, as the local runner will ask for, unless the command names a
    runner or the local runner's mode or worker count (then they start as the runner asks)."""
    from beam_jobs.local_runner import WORKER_PROCESSES, available_cores, local_parallelism  # pylint: disable=import-outside-toplevel
    from beam_jobs.warm_workers import start_warm_workers  # pylint: disable=import-outside-toplevel

    chosen = ("--runner", "--direct_running_mode", "--direct_num_workers")
    if any(token.split("=", 1)[0] in chosen for token in argv):
        return None
    parallelism = local_parallelism(available_cores())
    return start_warm_workers(parallelism.workers) if parallelism.mode == WORKER_PROCESSES else None


def _run_command(argv: list[str], *, warm: bool = False) -> None:
    from beam_jobs.command_line.flags import help_parser  # pylint: disable=import-outside-toplevel

    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
    if "--version" in argv:
        help_parser().parse_args(["--version"])  # prints "images-to-tfrecords <version>" and exits 0
    workers = _start_warm_workers(argv) if warm else None
    try:
        _run_checked_command(argv)
    finally:
        if workers is not None:
            workers.close()


def _run_checked_command(argv: list[str]) -> None:
    from beam_jobs.command_line.flags import PROG  # pylint: disable=import-outside-toplevel
    from beam_jobs.paths import redact  # pylint: disable=import-outside-toplevel

    problem = misspelt_flag(argv)
    if problem is not None:
        print(f"{PROG}: error: {redact(problem)}", file=sys.stderr)
        raise SystemExit(2)
    from beam_jobs.command_line.job_main import main as run_job  # pylint: disable=import-outside-toplevel

    run_job(argv)


def _exit_as_the_interpreter_would(code: object) -> None:
    """Ends the process as Python's exit does (threads joined, exit handlers run, streams flushed),
    then at once, without the rest of the interpreter's teardown.

    That teardown first puts every signal back to its default, so a SIGTERM in it (it lasts a
    tenth of a second or more after a run: Beam, gRPC and the codecs' modules are torn down and
    their heap collected) ended the process by the raw signal, without its line; and nothing in it
    needs doing. Here the command's handler stays in place until os._exit.
    """
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"), as Python prints it
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # pylint: disable=protected-access  # logging's flush among them
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()

"""The conversion command's run and its console: the run's outcome as the table, the summary and
the next steps, and every failure as one ``images-to-tfrecords: error:`` line with its exit code."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_jobs.command_line.arguments import PROG, UsageError, help_parser, parse_job_arguments
from beam_jobs.command_line.job_logging import configure_job_logging
from beam_jobs.command_line.run_console import TerminalConsole
from beam_jobs.command_line.run_summary import next_steps_lines, outputs_lines, split_table
from beam_jobs.command_line.termination import (
    InterruptedState,
    Terminated,
    interrupted_line,
    sigterm_as_interrupt,
    state_outside_the_run,
)
from beam_jobs.failures import describe_failure
from beam_jobs.listing.policy import ignored_note
from beam_jobs.paths import redact
from beam_jobs.run import run_spec
from beam_jobs.writing.finalize import DROPPED_REASONS, PLAN_FILE, plan_line, plan_warning_lines
from beam_jobs.writing.run_lock import OutputLockedError

__all__ = ["main", "run"]


def run(argv: Sequence[str] | None = None) -> dict:
    """Runs the job that the command line ``argv`` describes and returns the dataset_info.json it
    wrote. The only place that reads argv: it parses it into the spec, once."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
    spec, options = parse_job_arguments(argv)
    return run_spec(spec, options)


def _exit_now(code: int) -> None:
    """Ends an interrupted run once run() has cleaned up: the local runner's threads that wait on a
    bundle of a worker the signal killed would never finish, and a normal exit waits for them."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: every failure ends in one `images-to-tfrecords: error:` line.

    Exit 2 for a command line the job refuses (and an output folder another run holds), 1 for a run
    that failed, 130 when interrupted (SIGINT, Ctrl-C), 143 when terminated (SIGTERM), which is
    what a shell reports for a job each signal ended.
    With --log_level DEBUG the full trace is printed first.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
    level = configure_job_logging(argv)
    try:
        with sigterm_as_interrupt():
            spec, options = parse_job_arguments(argv)
            info = run_spec(spec, options, TerminalConsole(spec, options))
            # From here to the process's exit, a SIGTERM's line says that the run had finished.
            state_outside_the_run(InterruptedState(completed=True, plan_only=spec.mode.plan_only))
    except (UsageError, OutputLockedError) as error:  # Refused before any work: exit 2 for both.
        print(f"{PROG}: error: {redact(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, Terminated)
        line = interrupted_line(
            overwrite="--overwrite" in argv, terminated=terminated, state=getattr(interrupt, "state", None)
        )
        print(line, file=sys.stderr)
        _exit_now(143 if terminated else 130)  # 128 + the signal, as a shell reports a job it ended
    except Exception as error:  # Runners wrap worker exceptions; surface the cause plainly.
        if level == "DEBUG":
            traceback.print_exc()
        message, trace_helps = describe_failure(error)
        hint = " (--log_level DEBUG shows the full trace)" if trace_helps and level != "DEBUG" else ""
        print(f"{PROG}: error: {message}{hint}", file=sys.stderr)
        raise SystemExit(1) from None
    if spec.mode.plan_only:
        _print_plan(info, spec.output_dir)
    elif info.get("nothing_appended"):
        _print_nothing_appended(info)
    else:
        _print_committed(info, spec.output_dir)


def _print_plan(info: dict, output_dir: str) -> None:
    """The plan's line and warnings; exit 1 when the run it plans would fail."""
    print(
        f"{plan_line(info, info['dead_letters']['by_reason'])}{ignored_note(info.get('ignored', {}))}; wrote "
        f"{redact(FileSystems.join(output_dir, PLAN_FILE))}"
    )
    for warning in plan_warning_lines(info):
        print(warning)
    if info.get("would_fail"):
        print(
            f"{PROG}: error: {info['would_fail']} (see "
            f"{redact(FileSystems.join(output_dir, info['dead_letters']['file']))})",
            file=sys.stderr,
        )
        raise SystemExit(1)


def _print_nothing_appended(info: dict) -> None:
    by_reason = info["nothing_appended"]["by_reason"]
    dead = sum(by_reason.values())
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items()))
    print(
        f"--append: version {info.get('version')} stays current; nothing was committed"
        + (
            f": no input it did not hold became an example; this run's {_plural(dead, 'dead letter')} "
            f"({reasons}) {'is' if dead == 1 else 'are'} in {redact(info['nothing_appended']['file'])}"
            if dead
            else ""
        )
    )


def _print_committed(info: dict, output_dir: str) -> None:
    print(split_table(info))
    # Repeated at the end, with those the plan could not know (a class whose examples of a split
    # all became dead letters): the plan line scrolled away long ago on a long run.
    for warning in plan_warning_lines(info):
        print(warning)
    print(_summary(info, output_dir))
    print("\n".join(outputs_lines(info, output_dir)))
    print("\n".join(next_steps_lines(info, output_dir)))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _summary(info: dict, output_dir: str) -> str:
    splits = ", ".join(
        f"{name}: {_plural(s['num_examples'], 'example')} in {_plural(s['num_shards'], 'shard')}"
        for name, s in info["splits"].items()
    )
    by_reason = info.get("dead_letters_by_reason", {})
    dropped = sum(count for reason, count in by_reason.items() if reason in DROPPED_REASONS)
    unusable = info["num_dead_letters"] - dropped
    change = info.get("change") or {}
    # An append also drops the new inputs whose bytes the version holds under the same label.
    why = "--dedup, or bytes held already" if change.get("kind") == "append" else "--dedup"
    copies = f", {dropped} copies dropped ({why})" if dropped else ""
    committed = ""
    if info.get("version"):
        added = change.get("added")
        what = (
            f"appended {', '.join(f'{n} {split}' for split, n in (added or {}).items()) or 'no example'} to version "
            f"{info.get('parent_version')}"
            if change.get("kind") == "append"
            else change.get("kind", "create")
        )
        committed = f"committed version {info['version']} ({what}): "
    if not unusable and not dropped:  # an empty dead-letter file is not worth pointing to
        return f"{committed}wrote {splits} to {redact(output_dir)}; every input became an example"
    return (
        f"{committed}wrote {splits} to {redact(output_dir)}; {_plural(unusable, 'input')} could not be used"
        f"{copies} (see {FileSystems.join(redact(output_dir), info['dead_letters_file'])})"
    )

"""The job's command line: strict parsing, every value checked, no filesystem or network access.

    python -m beam_jobs.command_line.arguments JOB_ARGS...   # exit 0 and one "ok" line, or exit 2 and one error line

Launch scripts use that entry point for their dry runs, so that a dry run refuses exactly what
the job would refuse, without touching storage or a cloud API.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, _BeamArgumentParser

from beam_jobs.command_line.flags import PROG, add_job_flags, help_parser, unknown_flag_message
from beam_jobs.command_line.job_server_flags import (
    job_server_option_strings,
    other_runners_flag,
    quiet_beams_warning_for,
    quiet_warnings_apply,
    runner_option_error,
)
from beam_jobs.command_line.options import ConversionOptions
from beam_jobs.errors import UsageError
from beam_jobs.paths import redact
from beam_jobs.spec import ConversionSpec, absolute_uri, run_settings

__all__ = [
    "ConversionSpec",
    "JobArguments",
    "UsageError",
    "absolute_uri",
    "expand_verbosity",
    "help_parser",
    "job_flag_actions",
    "job_flag_names",
    "main",
    "parse_job_arguments",
    "run_settings",
    "runner_args_of",
    "runner_options",
]


class _RaisingParser(_BeamArgumentParser):
    """Beam's own parser (so every Beam flag is known), raising instead of printing usage and exiting."""

    def error(self, message: str):
        raise UsageError(message)


def _all_flags_parser() -> _RaisingParser:
    # The same set of option classes that Beam's PipelineOptions.get_all_options() parses with.
    parser = _RaisingParser(allow_abbrev=False, add_help=False)
    classes: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


_VERBOSE = re.compile(r"^-(v+)$")


def expand_verbosity(argv: Sequence[str]) -> list[str]:
    """``-v`` (and ``-vv``, or ``-v -v``) as ``--log_level INFO`` (``DEBUG``): the one short flag the
    job takes, read before anything else parses the command line (Beam's parser knows no -v)."""
    count = 0
    rest = []
    for arg in argv:
        match = _VERBOSE.match(arg)
        if match:
            count += len(match.group(1))
        else:
            rest.append(arg)
    if not count:
        return rest
    if any(arg == "--log_level" or arg.startswith("--log_level=") for arg in rest):
        raise UsageError("give -v or --log_level, not both")
    return [*rest, f"--log_level={'INFO' if count == 1 else 'DEBUG'}"]


def _refuse_unknown(argv: Sequence[str]) -> None:
    """Beam only logs a warning for an argument it does not know and runs with the defaults; a
    misspelt --image-size would then silently write a 224 px dataset. Here it is an error."""
    parser = _all_flags_parser()
    _, unknown = parser.parse_known_args(list(argv))
    # FlinkRunner's and SparkRunner's own options: Beam's runner parses them at submission, with
    # the descriptions its job server gives (job_server_flags.py).
    runners_own = job_server_option_strings(argv)
    misread = runner_option_error(argv)
    if misread:
        raise UsageError(misread)
    kept = _without_options(unknown, runners_own)
    if quiet_warnings_apply(argv):
        quiet_beams_warning_for(arg for arg in unknown if arg not in kept)
    unknown = kept
    if not unknown:
        return
    known = [option for action in parser._actions for option in action.option_strings]  # pylint: disable=protected-access
    name = unknown[0].split("=", 1)[0]
    raise UsageError(other_runners_flag(name, argv) or unknown_flag_message(unknown[0], [*known, *runners_own]))


def _without_options(args: Sequence[str], options: frozenset[str]) -> list[str]:
    """``args`` without those of ``options``, each with its value (``--name=value``, or the next
    argument where it is not a flag itself: a job server's switch, ``--object_reuse``, has none)."""
    kept: list[str] = []
    after_option = False
    for arg in args:
        if arg.startswith("--"):
            after_option = arg.split("=", 1)[0] in options and "=" not in arg
            if arg.split("=", 1)[0] not in options:
                kept.append(arg)
        elif after_option:
            after_option = False  # that option's value
        else:
            kept.append(arg)
    return kept


def _refuse_repeats_and_blanks(argv: Sequence[str]) -> None:
    """The job's own flags may be given once, with a value: with argparse the last of two
    --image_size wins silently, and an empty --input= would count as not given."""
    own = {
        option: action
        for action in help_parser()._actions  # pylint: disable=protected-access
        for option in action.option_strings
        if option.startswith("--")
    }
    seen: dict[str, int] = {}
    for index, arg in enumerate(argv):
        name, has_value, value = arg.partition("=")
        if name not in own or own[name].dest == "help":
            continue
        seen[name] = seen.get(name, 0) + 1
        if seen[name] == 2:
            raise UsageError(f"{name} is given more than once; give it once")
        takes_value = own[name].nargs != 0
        if takes_value:
            if not has_value:
                value = argv[index + 1] if index + 1 < len(argv) else ""
            if not value.strip():
                raise UsageError(f"{name} needs a value (got an empty one)")


def _check_runner(name: str | None) -> None:
    """Beam resolves --runner only when the pipeline runs; a misspelt name is caught here."""
    if name is None or "." in name:
        return
    known = {path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS} | {"FnApiRunner"}
    lowered = {k.lower(): k for k in known} | {k.lower().removesuffix("runner"): k for k in known}
    if name.lower() not in lowered:
        guess = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {guess[0]}?" if guess else f"; expected one of {', '.join(sorted(known))}"
        raise UsageError(f"--runner {name} is not a runner Beam knows{hint}")


# The spec is the job's arguments: the name stays for the code that imported it.
JobArguments = ConversionSpec


def job_flag_actions() -> dict[str, argparse.Action]:
    """The job's own flags (not -v, --runner or Beam's), by name: the names of convert()'s
    keywords too, with their types, choices and defaults."""
    parser = argparse.ArgumentParser(add_help=False)
    add_job_flags(parser)
    return {action.dest: action for action in parser._actions}  # pylint: disable=protected-access


def job_flag_names() -> tuple[str, ...]:
    """The names of the job's own flags."""
    return tuple(job_flag_actions())


def job_flag_values(options: PipelineOptions) -> dict[str, Any]:
    """The job's own flags from Beam's parse, by name, typed (what ConversionSpec.from_flags takes)."""
    flags = options.view_as(ConversionOptions)
    return {dest: getattr(flags, dest) for dest in job_flag_names()}


def runner_args_of(argv: Sequence[str]) -> tuple[str, ...]:
    """The part of a (checked) command line that is Beam's: every argument but the job's own flags
    and their values, as Beam's PipelineOptions takes them."""
    own = {option: action.nargs != 0 for action in job_flag_actions().values() for option in action.option_strings}
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name, has_value, _ = arg.partition("=")
        if name in own:
            skip_value = own[name] and not has_value
            continue
        kept.append(arg)
    return tuple(kept)


def runner_options(runner_args: Sequence[str]) -> PipelineOptions:
    """Beam's options from ``runner_args``, checked as the job checks its own: an unknown flag, a
    misspelt runner and a negative worker count are refused here, not late in the run."""
    _refuse_unknown(runner_args)
    options = PipelineOptions(list(runner_args))
    _check_runner(options.view_as(StandardOptions).runner)
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:  # Beam's own parse takes any int; the local runner would fail late
        raise UsageError(f"--direct_num_workers must be 0 (all cores) or more (got {workers})")
    return options


def parse_job_arguments(argv: Sequence[str]) -> tuple[ConversionSpec, PipelineOptions]:
    """Parses and checks the whole command line into the run's spec and Beam's options; raises
    UsageError naming the first bad value."""
    argv = expand_verbosity(argv)
    _refuse_repeats_and_blanks(argv)  # first: a second or blank --runner decides which flags are known
    _refuse_unknown(argv)
    runner_args = runner_args_of(argv)
    options = runner_options(runner_args)
    spec = ConversionSpec.from_flags(job_flag_values(PipelineOptions(argv)), runner_args)
    return spec, options


def main(argv: Sequence[str] | None = None) -> int:
    """Checks a job command line without running anything: for dry runs of the launch scripts."""
    logging.disable(logging.WARNING)  # Beam's own parse-time warnings would only repeat ours.
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        arguments, _ = parse_job_arguments(argv)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(
        f"ok: the job arguments are valid (input {redact(arguments.source.where)}, output "
        f"{redact(arguments.output_dir)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

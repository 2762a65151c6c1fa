"""The job as one Python call, for notebooks and scripts: ``beam_jobs.convert(...)``.

Each keyword argument is one of the command line's flags (``flags.py``), so the call is checked by
the very parser the command line uses, and a notebook and a shell run write the same bytes.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from beam_jobs.errors import UsageError

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs.spec import ConversionSpec
    from tfdata_readers.sources.manifest_types import DatasetInfo

__all__ = ["committed_info", "convert", "convert_argv", "in_keyword_terms", "spec_from_keywords"]


def convert(
    input: str | None = None,  # noqa: A002 - the flag's own name, --input
    *,
    output_dir: str | None = None,
    manifest: str | None = None,
    coco_annotations: str | None = None,
    unannotated: str = "keep",
    coco_masks: bool = False,
    annotation_frame: str = "auto",
    image_size: int | str | tuple[int, int] | None = None,
    resize_mode: str = "crop",
    max_side: int | None = None,
    resample: str | None = None,
    channels: int = 3,
    encoding: str = "jpeg",
    jpeg_quality: int = 95,
    splits: str | Mapping[str, float] | None = None,
    split_rule: str = "stratified",
    split_groups: str = "none",
    near_copy_bits: int = 14,
    group_pattern: str | None = None,
    tree_layout: str = "auto",
    num_shards: int = 0,
    target_shard_mb: float | None = None,
    dedup: str = "path",
    allow_outside_root: bool = False,
    max_pixels: int | None = None,
    max_file_mb: float | None = None,
    isolation: str | None = None,
    decode_timeout_s: float | None = None,
    max_bad_fraction: float = 0.01,
    plan_only: bool = False,
    overwrite: bool = False,
    append: bool = False,
    changed_sources: str = "refuse",
    relabel: str = "keep",
    keep_versions: int = 2,
    resume: bool = False,
    log_level: str = "WARNING",
    runner: str | None = None,
    beam_options: Mapping[str, Any] | Sequence[str] | None = None,
    spec: ConversionSpec | None = None,
) -> DatasetInfo | dict:
    """Converts a folder tree (``input``) or a CSV/JSONL list (``manifest``) into TFRecord shards.

    Every keyword is the command line's flag of the same name (``images-to-tfrecords --help``
    describes each one), and ``None`` means the flag's own default. ``splits`` may be a mapping,
    ``{"train": 0.9, "validation": 0.1}``, and ``image_size`` a pair ``(width, height)``.
    ``runner`` and ``beam_options`` (a mapping such as ``{"direct_num_workers": 2}`` or a list of
    ``--flag=value`` strings) go to Beam; with neither, the job runs on every local core.

    Returns the committed version's manifest as a ``tfdata_readers.DatasetInfo``, the type
    ``tfdata_readers.load_manifest`` returns (typed fields: ``info.splits["train"].num_examples``,
    ``info.label_names``; the JSON as before: ``info["splits"]``, ``info.to_json()``); with
    ``plan_only``, the plan as a dict. Arguments the command line would refuse raise
    ``beam_jobs.UsageError`` (a ``ValueError``) with the command line's message (its flags written
    as keywords: ``overwrite=True`` for ``--overwrite``), before anything is read or written; a run
    that fails raises the error that failed it, after removing what it had written (the version before it stays the
    current one). Ctrl-C (SIGINT) and SIGTERM interrupt it as they do the command line: what the run
    wrote is removed and ``KeyboardInterrupt`` is raised (one that arrives during the commit's own
    few writes waits for them: the new version is then committed, and the exception's ``state``
    has ``completed`` true); a runner that does not stop within 10 s
    of the signal ends the process, as the command line does, rather than hang it. The caller's
    logging configuration is put back as it was when the call returns.
    """
    arguments = {name: value for name, value in locals().items() if name not in ("beam_options", "spec")}
    with _errors_in_keyword_terms():
        if spec is None:
            spec, options = spec_from_keywords(arguments, beam_options)
        else:
            options = _spec_given(spec, arguments, beam_options)
        written = _run_as_the_command_line_does(spec, options)
    return written if spec.mode.plan_only else committed_info(written, spec.output_dir)


def _run_as_the_command_line_does(spec: ConversionSpec, options: PipelineOptions) -> dict:
    """Runs ``spec`` with the command line's console, logging and signal handling, inside the
    caller's process: SIGTERM interrupts it as Ctrl-C does, and the caller's logging
    configuration is put back afterwards."""
    # Imported here: Beam's import (a second or more) is paid on the first call, not by `import beam_jobs`.
    from beam_jobs.command_line.job_logging import (  # pylint: disable=import-outside-toplevel
        callers_logging_kept,
        configure_logging_for,
    )
    from beam_jobs.command_line.run_console import TerminalConsole  # pylint: disable=import-outside-toplevel
    from beam_jobs.command_line.termination import sigterm_as_interrupt  # pylint: disable=import-outside-toplevel
    from beam_jobs.run import run_spec  # pylint: disable=import-outside-toplevel

    with callers_logging_kept():
        configure_logging_for(spec.log_level, spec.runner_args, keep_handlers=True)
        try:
            with sigterm_as_interrupt():
                return run_spec(spec, options, TerminalConsole(spec, options))
        except KeyboardInterrupt as interrupt:
            raise _said(interrupt, overwrite=spec.mode.overwrite) from None


def committed_info(manifest: dict, output_dir: str) -> DatasetInfo:
    """The manifest a run committed, typed as the reader's ``load_manifest`` types it (the JSON stays
    reachable: ``info["splits"]``, ``info.to_json()``)."""
    # Imported here, as Beam is: `import beam_jobs` stays light. This module imports no TensorFlow.
    from tfdata_readers.sources.manifest_types import (  # pylint: disable=import-outside-toplevel
        MANIFEST_NAME,
        parse_manifest,
    )

    info, problems = parse_manifest(manifest, data_dir=output_dir, path=os.path.join(output_dir, MANIFEST_NAME))
    if problems:  # the job wrote it: a problem here is the job's own bug, said as such
        raise RuntimeError(f"the manifest just committed to {output_dir} has problems: {'; '.join(problems)}")
    return info


def spec_from_keywords(
    arguments: Mapping[str, Any], beam_options: Mapping[str, Any] | Sequence[str] | None = None
) -> tuple[ConversionSpec, Any]:
    """The spec (and Beam's options) that ``convert``'s keyword arguments describe, built directly:
    each keyword is checked against its flag's declaration (a switch takes True or False, a
    choice one of its values, a number a number), then ConversionSpec.from_flags builds it as it
    does from the command line's parse, so the two make equal specs for equal settings."""
    from beam_jobs.command_line.arguments import job_flag_actions, runner_options  # pylint: disable=import-outside-toplevel
    from beam_jobs.spec import ConversionSpec  # pylint: disable=import-outside-toplevel

    actions = job_flag_actions()
    values = {name: action.default for name, action in actions.items()}
    for name, value in arguments.items():
        if name == "runner" or value is None:
            continue
        values[name] = _keyword_value(name, value, actions[name])
    runner_args = _runner_args(arguments.get("runner"), beam_options, own=set(actions))
    options = runner_options(runner_args)
    return ConversionSpec.from_flags(values, runner_args), options


def _keyword_value(name: str, value: Any, action: Any) -> Any:
    """One keyword's value as its flag's parse would give it, or a UsageError naming it."""
    switch = action.nargs == 0
    if switch and not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False (got {value!r})")
    if not switch and isinstance(value, bool):
        raise UsageError(f"{name} takes a value, not {value!r}")
    if name == "image_size" and isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise UsageError(f"image_size is a size (224) or a pair (width, height), not {value!r}")
        value = "x".join(str(side) for side in value)
    elif name == "image_size":
        value = str(value)
    if name == "splits" and isinstance(value, Mapping):
        return dict(value)
    if action.type is not None and not switch:
        value = _typed(name, value, action.type)
    if action.choices is not None and value not in action.choices:
        raise UsageError(f"{name} must be one of {', '.join(map(repr, action.choices))} (got {value!r})")
    return value


def _typed(name: str, value: Any, kind: Any) -> Any:
    """``value`` as the flag's type: text is converted as the command line converts it; a number
    must already be one (a float where an int is due is refused, not rounded)."""
    if kind is int and not isinstance(value, str):
        if not isinstance(value, int):
            raise UsageError(f"{name} must be an integer (got {value!r})")
        return value
    if kind is float and not isinstance(value, str):
        if not isinstance(value, (int, float)):
            raise UsageError(f"{name} must be a number (got {value!r})")
        return float(value)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}: {value!r} is not a valid value") from None


def _runner_args(
    runner: str | None, beam_options: Mapping[str, Any] | Sequence[str] | None, *, own: set[str]
) -> tuple[str, ...]:
    """Beam's options as ``--flag=value`` strings: the runner, then ``beam_options``."""
    from beam_jobs.command_line.job_server_flags import switch_arguments  # pylint: disable=import-outside-toplevel

    args = [] if runner is None else [f"--runner={runner}"]
    if isinstance(beam_options, Mapping):
        for name, value in beam_options.items():
            switch = switch_arguments(name, value) if isinstance(value, bool) else None
            args += _as_flag(name, value) if switch is None else switch
    elif beam_options is not None:
        if isinstance(beam_options, str):
            raise TypeError("beam_options is a mapping or a list of '--flag=value' strings, not one string")
        args.extend(beam_options)
    if "-h" in args or "--help" in args:  # The command line would print its help and exit 0.
        raise UsageError("convert() takes no --help: help(beam_jobs.convert), or images-to-tfrecords --help")
    # Beam takes the last of two runners silently; the command line refuses a repeat, and so does this.
    if sum(arg.split("=", 1)[0] == "--runner" for arg in args) > 1:
        where = "as runner= and in beam_options" if runner is not None else "in beam_options"
        raise UsageError(f"the runner is given twice, {where}; give it once")
    for arg in args:
        name = arg.split("=", 1)[0].removeprefix("--")
        if name in own:
            raise UsageError(f"{name} is convert()'s own keyword: give {name}=... to convert(), not in beam_options")
    return tuple(args)


def _spec_given(spec: ConversionSpec, arguments: Mapping[str, Any], beam_options: Any) -> Any:
    """Beam's options for a spec given whole; any other keyword besides it is refused."""
    from beam_jobs.command_line.arguments import runner_options  # pylint: disable=import-outside-toplevel

    defaults = {name: parameter.default for name, parameter in inspect.signature(convert).parameters.items()}
    given = sorted(name for name, value in arguments.items() if value != defaults.get(name))
    if given or beam_options is not None:
        raise UsageError(
            f"convert() takes a spec or keywords, not both (got spec and {', '.join(given) or 'beam_options'}); "
            "the spec's runner_args carry Beam's options"
        )
    return runner_options(spec.runner_args)


# Where in the graph a runner was when a step failed: Beam appends it to the step's error, and a
# caller of convert() has no graph to look it up in (the message already names the file or flag).
_WHILE_RUNNING = re.compile(r"\s*\[while running '[^']*'\]")
# A flag as the job's messages write it, not inside a word or a path ("/data/x--overwrite").
_FLAG = re.compile(r"(?<![\w/-])--([a-z][a-z0-9_]*)(=\S+)?(?: ([a-z][a-z0-9_]*)\b)?")


def _keywords() -> dict[str, tuple[bool, tuple[str, ...]]]:
    """convert()'s keywords, each with whether it is a switch (a flag that takes no value) and the
    values it takes when they are a fixed few (``changed_sources``: "refuse", "keep")."""
    from beam_jobs.command_line.flags import help_parser  # pylint: disable=import-outside-toplevel

    names = set(convert.__code__.co_varnames[: convert.__code__.co_argcount + convert.__code__.co_kwonlyargcount])
    actions = {action.dest: action for action in help_parser()._actions}  # pylint: disable=protected-access
    return {
        name: (
            name in actions and actions[name].nargs == 0,
            tuple(str(c) for c in (actions[name].choices or ())) if name in actions else (),
        )
        for name in names
    }


def in_keyword_terms(message: str) -> str:
    """The job's message as a caller of convert() reads it: ``--overwrite`` is ``overwrite=True``,
    ``--max_bad_fraction=0.01`` is ``max_bad_fraction=0.01``. One mapping for every message, so
    that each is written once, for the command line. Pure."""
    keywords = _keywords()

    def keyword(match: re.Match) -> str:
        name, value, word = match.group(1), match.group(2), match.group(3)
        if name not in keywords:
            return match.group(0)
        switch, choices = keywords[name]
        after = f" {word}" if word else ""
        if value:
            return f"{name}{value}{after}"
        if switch:
            return f"{name}=True{after}"
        if word in choices:  # "--changed_sources keep": the flag and its value
            return f"{name}={word!r}"
        return f"{name}{after}"

    return _FLAG.sub(keyword, _WHILE_RUNNING.sub("", message))


def _said(interrupt: KeyboardInterrupt, *, overwrite: bool) -> KeyboardInterrupt:
    """The interrupt (Ctrl-C, or SIGTERM's Terminated) with the command line's one line as its
    message, in keyword terms ("terminated (SIGTERM); the 3 shards converted so far are staged:
    rerun with resume=True ..."), and without the runner's frames: where the signal landed inside
    Beam's threads says nothing to the caller, what the run left does."""
    from beam_jobs.command_line.flags import PROG  # pylint: disable=import-outside-toplevel
    from beam_jobs.command_line.termination import Terminated, interrupted_line  # pylint: disable=import-outside-toplevel

    line = interrupted_line(
        overwrite=overwrite, terminated=isinstance(interrupt, Terminated), state=getattr(interrupt, "state", None)
    )
    interrupt.args = (in_keyword_terms(line.removeprefix(f"{PROG}: ").removeprefix("error: ")),)
    return interrupt.with_traceback(None)


@contextmanager
def _errors_in_keyword_terms() -> Iterator[None]:
    """Re-raises the run's errors (same type, same traceback) with their flags named as keywords:
    the job's own, and a runner's that carries one of them in its text."""
    try:
        yield
    except Exception as error:
        own = _own_error_inside(error)
        if own is not None:
            # A runner re-raises a worker's exception as its own (a RuntimeError carrying the
            # worker's trace as text): the caller gets the job's error, by its type and message.
            raise own from error
        if error.args and isinstance(error.args[0], str):
            error.args = (in_keyword_terms(error.args[0]), *error.args[1:])
        raise


def _own_error_inside(error: Exception) -> Exception | None:
    """The job's own error (SourceChangesError, TooManyBadInputsError, ...) that a runner's
    exception carries in its text, rebuilt with its one-line message in keyword terms; None when
    ``error`` is the job's own already, or carries none."""
    from beam_jobs.errors import JobError, UsageError  # pylint: disable=import-outside-toplevel
    from beam_jobs.failures import describe_failure  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.append import SourceChangesError  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.commit import CommitConflictError  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.finalize import TooManyBadInputsError  # pylint: disable=import-outside-toplevel

    if isinstance(error, (JobError, UsageError, TooManyBadInputsError)):
        return None
    message, trace_helps = describe_failure(error)
    if trace_helps:
        return None
    text = str(error)
    for kind in (SourceChangesError, TooManyBadInputsError, CommitConflictError, JobError, UsageError):
        if f"{kind.__name__}: " in text:
            return kind(in_keyword_terms(message))
    return None


def convert_argv(
    arguments: Mapping[str, Any],
    beam_options: Mapping[str, Any] | Sequence[str] | None = None,
) -> list[str]:
    """The command line that ``convert``'s keyword arguments stand for: a pure function, tested
    against the command line's own parser so that the two cannot drift apart. A value the command
    line could not express (a switch that is not a bool, a size that is not a pair) is refused
    here, with the keyword's own name."""
    from beam_jobs.command_line.flags import help_parser  # pylint: disable=import-outside-toplevel

    switches = {a.dest for a in help_parser()._actions if a.nargs == 0}  # pylint: disable=protected-access
    argv: list[str] = []
    for name, value in arguments.items():
        if name in switches and value is not None and not isinstance(value, bool):
            raise UsageError(f"{name} must be True or False (got {value!r})")
        if name not in switches and isinstance(value, bool):
            raise UsageError(f"{name} takes a value, not {value!r}")
        if name == "image_size" and isinstance(value, (tuple, list)) and len(value) != 2:
            raise UsageError(f"image_size is a size (224) or a pair (width, height), not {value!r}")
        if name == "splits" and isinstance(value, Mapping):
            value = ",".join(f"{split}={fraction}" for split, fraction in value.items())
        elif name == "image_size" and isinstance(value, (tuple, list)):
            value = "x".join(str(side) for side in value)
        argv += _as_flag(name, value)
    # Beam's options as spec_from_keywords reads them; here a job flag among them is left to the
    # command line's parser, which refuses it given twice.
    return argv + list(_runner_args(None, beam_options, own=set()))


def _as_flag(name: str, value: Any) -> list[str]:
    """One keyword as the command line writes it: None is the flag's default and False a switch
    left off (nothing), True a switch given, anything else ``--name=value``."""
    if value is None or value is False:
        return []
    return [f"--{name}"] if value is True else [f"--{name}={value}"]

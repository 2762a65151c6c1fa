"""The job's command line: strict parsing, every value checked, no filesystem or network access.

    python -m beam_jobs.command_line.arguments JOB_ARGS...   # exit 0 and one "ok" line, or exit 2 and one error line

Launch scripts use that entry point for their dry runs, so that a dry run refuses exactly what
the job would refuse, without touching storage or a cloud API.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, _BeamArgumentParser

from beam_jobs.command_line.flags import PROG, help_parser, unknown_flag_message
from beam_jobs.command_line.options import ConversionOptions
from beam_jobs.config import ImageConfig, parse_image_size, parse_splits
from beam_jobs.errors import UsageError
from beam_jobs.listing.coco import parse_coco_split_files
from beam_jobs.paths import redact
from beam_jobs.planning.rules import DEFAULT_SPLIT_RULE

__all__ = [
    "JobArguments",
    "UsageError",
    "expand_verbosity",
    "help_parser",
    "main",
    "parse_job_arguments",
    "run_settings",
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
    if not unknown:
        return
    known = [option for action in parser._actions for option in action.option_strings]  # pylint: disable=protected-access
    raise UsageError(unknown_flag_message(unknown[0], known))


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


@dataclasses.dataclass(frozen=True)
class JobArguments:
    """The job's arguments, typed and checked; paths are absolute (or URIs)."""

    input_root: str | None
    input_list: str | None
    output_dir: str
    image_config: ImageConfig
    split_fractions: dict[str, float] | None
    num_shards: int | None
    target_shard_mb: float
    max_bad_fraction: float
    dedup: str
    overwrite: bool
    resume: bool
    allow_outside_root: bool
    log_level: str
    tree_layout: str = "auto"
    plan_only: bool = False
    split_rule: str = DEFAULT_SPLIT_RULE
    append: bool = False
    keep_versions: int = 2
    changed_sources: str = "refuse"
    relabel: str = "keep"
    coco_files: list[tuple[str | None, str]] | None = None
    unannotated: str = "keep"
    coco_masks: bool = False

    @property
    def source(self) -> str:
        """Where the images come from, the root or the list file, for messages and the endpoint check."""
        return self.input_root or self.input_list or ""

    @property
    def target_shard_bytes(self) -> int:
        """--target_shard_mb in bytes, at least one, the unit the shard planner counts in."""
        return max(1, int(self.target_shard_mb * 2**20))

    @property
    def settings(self) -> dict:
        """The settings besides ImageConfig that shape the output (part of the run fingerprint)."""
        return run_settings(
            split_fractions=self.split_fractions,
            split_rule=self.split_rule,
            num_shards=self.num_shards,
            target_shard_mb=self.target_shard_mb,
            dedup=self.dedup,
        )


def run_settings(
    *,
    split_fractions: dict[str, float] | None,
    split_rule: str,
    num_shards: int | None,
    target_shard_mb: float,
    dedup: str,
) -> dict:
    """The settings besides ImageConfig that shape the output, as dataset_info.json records them and
    the run fingerprint hashes them: one shape for the command line and for ConvertImages, so that
    the same settings given either way make the same fingerprint (and --resume keeps the shards)."""
    return {
        "splits": split_fractions,
        "split_rule": split_rule,
        "num_shards": num_shards,
        "target_shard_mb": target_shard_mb,
        "dedup": dedup,
    }


def absolute_uri(path: str) -> str:
    """A local path made absolute (against the working directory), a URI unchanged; no "/" at the end."""
    if "://" not in path:
        path = os.path.abspath(os.path.expanduser(path))
    return path.rstrip("/") or "/"


def _finite(name: str, value: float, *, low: float, low_inclusive: bool = False, high: float = math.inf) -> float:
    ok = math.isfinite(value) and (value >= low if low_inclusive else value > low) and value <= high
    if not ok:
        bound = f">= {low}" if low_inclusive else f"> {low}"
        upper = "" if math.isinf(high) else f" and <= {high}"
        raise UsageError(f"{name} must be a finite number {bound}{upper} (got {value!r})")
    return value


# The smallest shard target worth having: below it every example would be a shard of its own.
_MIN_TARGET_SHARD_MB = 0.01


def parse_job_arguments(argv: Sequence[str]) -> tuple[JobArguments, PipelineOptions]:
    """Parses and checks the whole command line; raises UsageError naming the first bad value."""
    argv = expand_verbosity(argv)
    _refuse_unknown(argv)
    _refuse_repeats_and_blanks(argv)
    options = PipelineOptions(argv)
    _check_runner(options.view_as(StandardOptions).runner)
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:  # Beam's own parse takes any int; the local runner would fail late
        raise UsageError(f"--direct_num_workers must be 0 (all cores) or more (got {workers})")
    flags = options.view_as(ConversionOptions)
    if bool(flags.input) == bool(flags.manifest):
        raise UsageError(
            "give exactly one of --input DIR_OR_URI and --manifest FILE" + (" (got both)" if flags.input else "")
        )
    if not flags.output_dir:
        raise UsageError("--output_dir is required")
    _finite("--max_bad_fraction", flags.max_bad_fraction, low=0.0, low_inclusive=True, high=1.0)
    if flags.keep_versions < 1:
        raise UsageError(f"--keep_versions must be >= 1 (the new version's own files) (got {flags.keep_versions!r})")
    if flags.append and flags.overwrite:
        raise UsageError("give at most one of --append (add to the current version) and --overwrite (replace it)")
    if flags.append and flags.relabel == "sorted":
        raise UsageError(
            "--relabel sorted renumbers label ids, and --append keeps the current version's shards with their "
            "ids: rebuild with --overwrite --relabel sorted instead"
        )
    if flags.num_shards < 0:
        raise UsageError(f"--num_shards must be >= 0 (0: derived from --target_shard_mb) (got {flags.num_shards!r})")
    _finite("--target_shard_mb", flags.target_shard_mb, low=_MIN_TARGET_SHARD_MB, low_inclusive=True, high=2**20)
    _finite("--max_file_mb", flags.max_file_mb, low=0.0, high=2**20)
    _finite("--decode_timeout_s", flags.decode_timeout_s, low=0.0, high=86400.0)
    try:
        if flags.image_size is not None and flags.resize_mode == "keep":
            raise ValueError(
                "--image_size does not apply with --resize_mode keep: each image keeps its own size "
                "(--max_side caps its longer side)"
            )
        width, height = parse_image_size(flags.image_size or str(ImageConfig().width))
        config = ImageConfig(
            width=width,
            height=height,
            channels=flags.channels,
            resize_mode=flags.resize_mode,
            resample=flags.resample,
            encoding=flags.encoding,
            jpeg_quality=flags.jpeg_quality,
            max_pixels=flags.max_pixels,
            max_file_bytes=max(1, int(flags.max_file_mb * 2**20)),
            isolation=flags.isolation,
            decode_timeout_s=flags.decode_timeout_s,
            max_side=flags.max_side,
            annotation_frame=flags.annotation_frame,
        )
        split_fractions = parse_splits(flags.splits) if flags.splits else None
        coco_files = None
        if flags.coco_annotations:
            if not flags.input:
                raise ValueError("--coco_annotations names images under --input (the image root): give --input too")
            coco_files = [(split, absolute_uri(path)) for split, path in parse_coco_split_files(flags.coco_annotations)]
    except ValueError as error:
        raise UsageError(str(error)) from None
    arguments = JobArguments(
        input_root=absolute_uri(flags.input) if flags.input else None,
        input_list=absolute_uri(flags.manifest) if flags.manifest else None,
        output_dir=absolute_uri(flags.output_dir),
        image_config=config,
        split_fractions=split_fractions,
        num_shards=flags.num_shards or None,
        target_shard_mb=flags.target_shard_mb,
        max_bad_fraction=flags.max_bad_fraction,
        dedup=flags.dedup,
        overwrite=flags.overwrite,
        resume=flags.resume,
        allow_outside_root=flags.allow_outside_root,
        log_level=flags.log_level,
        tree_layout=flags.tree_layout,
        plan_only=flags.plan_only,
        split_rule=flags.split_rule,
        append=flags.append,
        keep_versions=flags.keep_versions,
        changed_sources=flags.changed_sources,
        relabel=flags.relabel,
        coco_files=coco_files,
        unannotated=flags.unannotated,
        coco_masks=flags.coco_masks,
    )
    return arguments, options


def main(argv: Sequence[str] | None = None) -> int:
    """Checks a job command line without running anything: for dry runs of the launch scripts."""
    logging.disable(logging.WARNING)  # Beam's own parse-time warnings would only repeat ours.
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        arguments, _ = parse_job_arguments(argv)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(f"ok: the job arguments are valid (input {redact(arguments.source)}, output {redact(arguments.output_dir)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

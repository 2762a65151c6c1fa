"""The job as one Python call, for notebooks and scripts: ``beam_jobs.convert(...)``.

Each keyword argument is one of the command line's flags (``flags.py``), so the call is checked by
the very parser the command line uses, and a notebook and a shell run write the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["convert", "convert_argv"]


def convert(
    input: str | None = None,  # noqa: A002 - the flag's own name, --input
    *,
    output_dir: str,
    manifest: str | None = None,
    image_size: int | str | tuple[int, int] = 224,
    resize_mode: str = "crop",
    resample: str = "bicubic",
    channels: int = 3,
    encoding: str = "jpeg",
    jpeg_quality: int = 95,
    splits: str | Mapping[str, float] | None = None,
    split_rule: str = "stratified",
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
    keep_versions: int = 2,
    resume: bool = False,
    log_level: str = "WARNING",
    runner: str | None = None,
    beam_options: Mapping[str, Any] | Sequence[str] | None = None,
) -> dict:
    """Converts a folder tree (``input``) or a CSV/JSONL list (``manifest``) into TFRecord shards.

    Every keyword is the command line's flag of the same name (``images-to-tfrecords --help``
    describes each one), and ``None`` means the flag's own default. ``splits`` may be a mapping,
    ``{"train": 0.9, "validation": 0.1}``, and ``image_size`` a pair ``(width, height)``.
    ``runner`` and ``beam_options`` (a mapping such as ``{"direct_num_workers": 2}`` or a list of
    ``--flag=value`` strings) go to Beam; with neither, the job runs on every local core.

    Returns the committed version's ``dataset_info.json`` (or, with ``plan_only``, the plan) as a
    dict. Arguments the command line would refuse raise ``beam_jobs.UsageError`` (a ``ValueError``)
    with the command line's message, before anything is read or written; a run that fails raises
    the error that failed it, after removing what it had written (the version before it stays the
    current one). Ctrl-C in a notebook interrupts it as on the command line.
    """
    arguments = {name: value for name, value in locals().items() if name != "beam_options"}
    argv = convert_argv(arguments, beam_options)
    # Imported here: Beam's import (a second or more) is paid on the first call, not by `import beam_jobs`.
    from beam_jobs.pipeline import configure_job_logging, run  # pylint: disable=import-outside-toplevel

    configure_job_logging(argv)
    return run(argv)


def convert_argv(
    arguments: Mapping[str, Any],
    beam_options: Mapping[str, Any] | Sequence[str] | None = None,
) -> list[str]:
    """The command line that ``convert``'s keyword arguments stand for: a pure function, tested
    against the command line's own parser so that the two cannot drift apart."""
    argv: list[str] = []
    for name, value in arguments.items():
        if value is None or value is False:
            continue  # None: the flag's default; False: a switch left off.
        if value is True:
            argv.append(f"--{name}")
            continue
        if name == "splits" and isinstance(value, Mapping):
            value = ",".join(f"{split}={fraction}" for split, fraction in value.items())
        elif name == "image_size" and isinstance(value, (tuple, list)):
            value = "x".join(str(side) for side in value)
        argv.append(f"--{name}={value}")
    if isinstance(beam_options, Mapping):
        for name, value in beam_options.items():
            if value is True:
                argv.append(f"--{name}")
            elif value is not None and value is not False:
                argv.append(f"--{name}={value}")
    elif beam_options is not None:
        if isinstance(beam_options, str):
            raise TypeError("beam_options is a mapping or a list of '--flag=value' strings, not one string")
        argv.extend(beam_options)
    return argv

"""The job's public names where they have always been imported from: ``ConvertImages`` (the whole
job as one transform, convert_images.py), ``run(argv)`` and ``main`` (the command line's run,
command_line/job_main.py). The code lives in those modules; this one only names it."""

from __future__ import annotations

from beam_jobs.command_line.job_main import main, run
from beam_jobs.convert_images import ConvertImages
from beam_jobs.failures import describe_failure

__all__ = ["ConvertImages", "describe_failure", "main", "run"]

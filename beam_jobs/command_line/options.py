"""The job's command-line flags, given to Beam's parser as a PipelineOptions subclass."""

from __future__ import annotations

import argparse

from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.command_line.flags import LOG_LEVELS, add_job_flags

__all__ = ["LOG_LEVELS", "ConversionOptions"]


class ConversionOptions(PipelineOptions):
    """Flags of images-to-tfrecords (declared in flags.py); standard Beam flags (--runner, ...) are
    parsed by Beam."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_job_flags(parser)

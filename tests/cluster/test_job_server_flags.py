"""The Java runners' options that the command line lets through (job_server_flags.py) are exactly
those that the job servers launch/ builds describe: each is started here, and asked as Beam's
portable runner asks it at a submission (DescribePipelineOptions)."""

from __future__ import annotations

import subprocess

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

from beam_jobs.command_line.beam_flags import BEAM_OPTION_STRINGS
from beam_jobs.command_line.flags import help_parser
from beam_jobs.command_line.job_server_flags import (
    FLINK_JOB_SERVER_OPTION_STRINGS,
    JOB_SERVER_RUNNER_VERSION,
    SPARK_JOB_SERVER_OPTION_STRINGS,
)
from tests.cluster.conftest import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _described_options(jar: str) -> frozenset[str]:
    """The option strings Beam Python's portable runner adds for what the job server describes,
    less Beam Python's own and the job's own (those the command line knows already)."""
    port = free_port()
    server = subprocess.Popen(
        ["java", "-jar", jar, f"--job-port={port}", "--artifact-port=0", "--expansion-port=0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=120)
            described = beam_job_api_pb2_grpc.JobServiceStub(channel).DescribePipelineOptions(
                beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=60
            )
    finally:
        server.terminate()
        server.wait(timeout=60)
    ours = {option for action in help_parser()._actions for option in action.option_strings}  # pylint: disable=protected-access
    return frozenset(f"--{option.name}" for option in described.options) - BEAM_OPTION_STRINGS - ours


@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize(
    ("runner", "listed"), [("flink", FLINK_JOB_SERVER_OPTION_STRINGS), ("spark", SPARK_JOB_SERVER_OPTION_STRINGS)]
)
def test_the_listed_runner_options_are_what_the_job_server_describes(runner, listed, request):
    jar = request.getfixturevalue(f"{runner}_job_server_jar")
    assert JOB_SERVER_RUNNER_VERSION in jar  # the job server the copy was made from
    live = _described_options(jar)
    missing, extra = sorted(live - listed), sorted(listed - live)
    assert listed == live, f"job_server_flags.py is out of date: missing {missing}, extra {extra}"

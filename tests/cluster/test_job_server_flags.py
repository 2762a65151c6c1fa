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
    FLINK_JOB_SERVER_OPTIONS,
    JOB_SERVER_RUNNER_VERSION,
    SPARK_JOB_SERVER_OPTIONS,
)
from tests.cluster.conftest import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _described_options(jar: str) -> dict[str, str]:
    """{option string: kind} as Beam Python's portable runner adds them for what the job server
    describes (a BOOLEAN as "store_true", or "store_false" where its default is true; an INTEGER
    as an int; an ARRAY as "append"), less Beam Python's own and the job's own options."""
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
    types = beam_job_api_pb2.PipelineOptionType
    kinds = {types.INTEGER: "int", types.NUMBER: "number", types.ARRAY: "list"}
    return {
        f"--{option.name}": (
            ("off" if option.default_value == "true" else "on")
            if option.type == types.BOOLEAN
            else kinds.get(option.type, "text")
        )
        for option in described.options
        if f"--{option.name}" not in BEAM_OPTION_STRINGS | ours
    }


@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize(
    ("runner", "listed"), [("flink", FLINK_JOB_SERVER_OPTIONS), ("spark", SPARK_JOB_SERVER_OPTIONS)]
)
def test_the_listed_runner_options_are_what_the_job_server_describes(runner, listed, request):
    jar = request.getfixturevalue(f"{runner}_job_server_jar")
    assert JOB_SERVER_RUNNER_VERSION in jar  # the job server the copy was made from
    live = _described_options(jar)
    differ = sorted(set(live.items()) ^ set(listed.items()))
    assert listed == live, f"job_server_flags.py is out of date (option, kind) on one side only: {differ}"

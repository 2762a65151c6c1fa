"""The one line a failed run prints, for failures that carry no message of the job's own."""

from __future__ import annotations

import socket

import grpc

from beam_jobs.failures import describe_failure


def _real_rpc_error() -> grpc.RpcError:
    """What gRPC raises when the other end is gone: a call to a port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/beam.JobService/GetState")
        try:
            call(b"", timeout=5)
        except grpc.RpcError as error:
            return error
    raise AssertionError("a call to a closed port succeeded")


def test_a_lost_job_service_is_named_with_its_grpc_code_and_the_job_it_may_leave_running():
    # A killed job server left "_MultiThreadedRendezvous: <_MultiThreadedRendezvous of RPC that
    # terminated with:", the first line of gRPC's text, which names no cause.
    line, trace_helps = describe_failure(_real_rpc_error())
    assert line.startswith("lost the connection to the runner's job service (gRPC UNAVAILABLE: "), line
    assert "may still be running" in line and "--resume" in line
    assert not trace_helps


def test_other_errors_keep_their_innermost_line():
    line, trace_helps = describe_failure(RuntimeError("Pipeline failed:\nValueError: bad pixel [while running 'X']"))
    assert line == "ValueError: bad pixel (in step X)" and trace_helps

"""The SDK worker pool of the launch scripts (launch/sdk_worker_pool.py) starts each worker forked
from a process that has already imported Beam, and starts it cold (a new interpreter) once that
process is gone. Its workers serving real jobs is tested with Flink and the portable job service."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import grpc
import psutil
import pytest
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2

from tests.cluster.conftest import LAUNCH, free_port, job_env, wait_for

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def pool():
    """(pool process, StartWorker caller). The workers' runner is a socket that accepts and never
    answers, so each worker waits in its first call to the provision service and stays visible."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    runner = f"127.0.0.1:{silent.getsockname()[1]}"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCH / "sdk_worker_pool.py"), "127.0.0.1", str(port)],
        env=job_env(),
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)

    def start_worker(worker_id: str) -> None:
        endpoint = endpoints_pb2.ApiServiceDescriptor(url=runner)
        request = beam_fn_api_pb2.StartWorkerRequest(
            worker_id=worker_id, control_endpoint=endpoint, provision_endpoint=endpoint
        )
        response = stub.StartWorker(request, timeout=120, wait_for_ready=True)
        assert not response.error, response.error

    try:
        yield psutil.Process(proc.pid), start_worker
    finally:
        channel.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        silent.close()


def test_workers_are_forked_warm_and_start_cold_once_the_forker_is_gone(pool):
    process, start_worker = pool
    forker = wait_for(lambda: process.children(), timeout=120, what="the forker")[0]
    start_worker("1-1")
    warm = wait_for(lambda: forker.children(), timeout=60, what="a forked worker")
    assert len(warm) == 1 and warm[0].cmdline() == process.cmdline()  # a fork: no new interpreter
    forker.kill()
    wait_for(lambda: not forker.is_running() or forker.status() == psutil.STATUS_ZOMBIE, timeout=30, what="its end")
    start_worker("1-2")
    cold = wait_for(
        lambda: [p for p in process.children() if "--worker" in p.cmdline()], timeout=60, what="a cold worker"
    )
    assert cold[0].cmdline()[-5] == "--worker"  # a new interpreter running one worker
    assert warm[0].is_running(), "the forker's end took its worker with it"

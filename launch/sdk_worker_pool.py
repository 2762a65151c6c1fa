"""The Beam Python SDK worker pool that flink_cluster.sh and run_portable.sh start for
--environment_type=EXTERNAL:  python launch/sdk_worker_pool.py HOST PORT

It differs from Beam's own worker_pool_main in three ways, each found by running jobs on it:

- It binds one address (Beam's binds every interface).
- StopWorker never kills. Several TaskManagers of one host share the pool and each numbers its
  workers from 1, so ids collide, and Beam's pool (one process per id) then killed another
  TaskManager's live worker, which hung that TaskManager for 3 minutes. A worker exits by itself
  when its runner hangs up its control stream (a finished environment, or a killed TaskManager);
  whatever is left dies with the pool, whose process group the launch scripts stop.
- Workers start as the SDK container's boot program starts them: the worker asks the runner's
  provision service for the job's pipeline options, then runs sdk_worker_main, which hands them
  to Beam's filesystems (s3:// failed with "Must provide one of client or options" without them)
  and applies the job's log levels.

And workers start warm: importing Beam and this project's conversion code cost each new worker
2-3 s of CPU on a busy 2-core machine before it could take its first bundle. A child forked at
the start (the forker) imports them once, before the gRPC server runs, and then forks every
worker from that state (fork is safe there: no gRPC channel or server exists in it yet). Where the
forker cannot serve (it died), a worker starts cold, as a new interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc
from apache_beam.runners.worker import worker_pool_main
from apache_beam.utils import thread_pool_executor

# Pipeline options that sdk_worker_main logs at INFO into the runner's logs: never their values.
CREDENTIALS = {"s3_access_key_id", "s3_secret_access_key", "s3_session_token", "azure_connection_string"}


class _HideCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # A lone dict argument becomes record.args itself (logging treats it as a mapping for %(key)s).
        if isinstance(record.args, dict):
            record.args = {k: "<redacted>" if k in CREDENTIALS else v for k, v in record.args.items()}
        return True


def run_worker(control: str, logs: str, provision: str, worker_id: str) -> None:
    """One SDK worker, as Beam's boot program runs it: the job's options from the provision
    service, then sdk_worker_main until the runner hangs up."""
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc
    from apache_beam.runners.worker import sdk_worker_main
    from google.protobuf import json_format

    logging.getLogger(sdk_worker_main.__name__).addFilter(_HideCredentials())
    with grpc.insecure_channel(provision) as channel:
        info = (
            beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
            .GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", worker_id)])
            .info
        )
    os.environ.update(
        {
            "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
            "CONTROL_API_SERVICE_DESCRIPTOR": f"url: {control!r}",
            "WORKER_ID": worker_id,
        }
    )
    if logs:
        os.environ["LOGGING_API_SERVICE_DESCRIPTOR"] = f"url: {logs!r}"
    else:
        os.environ.pop("LOGGING_API_SERVICE_DESCRIPTOR", None)
    sdk_worker_main.main(sys.argv[:1])


def _serve_forks(requests: int, replies: int) -> None:
    """The forker: imports what every worker needs, then forks one worker per request line (a
    JSON list of run_worker's arguments) and answers with its pid. Never returns."""
    from apache_beam.runners.worker import sdk_worker_main  # noqa: F401  (imported for the workers)

    try:  # The pool serves this project's jobs; another project's workers import their own code.
        from beam_jobs.writing import convert_shards  # noqa: F401
    except ImportError:
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    with os.fdopen(requests, "r") as lines, os.fdopen(replies, "w") as answers:
        for line in lines:
            pid = os.fork()
            if pid == 0:
                # The worker holds neither pipe: the pool must see the forker's end when it dies.
                os.close(requests)
                os.close(replies)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                logging.getLogger().handlers.clear()  # the worker logs to the runner, not the pool's file
                try:
                    run_worker(*json.loads(line))
                finally:
                    os._exit(0)
            answers.write(f"{pid}\n")
            answers.flush()
    os._exit(0)  # the pool is gone


class _Forker:
    """The pool's end of the forker: start(ARGS) -> the new worker's pid, or None when the forker
    is gone (then the caller starts the worker cold)."""

    def __init__(self) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(requests_w)
            os.close(replies_r)
            _serve_forks(requests_r, replies_w)
        os.close(requests_r)
        os.close(replies_w)
        self.pid = pid
        self._requests = os.fdopen(requests_w, "w")
        self._replies = os.fdopen(replies_r, "r")
        self._lock = threading.Lock()

    def start(self, args: list[str]) -> int | None:
        with self._lock:
            try:
                self._requests.write(json.dumps(args) + "\n")
                self._requests.flush()
                reply = self._replies.readline()
            except OSError:  # the forker is gone: reap it, and start workers cold from now on
                self._reap()
                return None
        if not reply.strip():
            self._reap()
            return None
        return int(reply)

    def _reap(self) -> None:
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class SharedWorkerPool(worker_pool_main.BeamFnExternalWorkerPoolServicer):
    def __init__(self, forker: _Forker) -> None:
        super().__init__(use_process=True)
        self._forker = forker
        self.cold: list[subprocess.Popen] = []
        self.warm: list[int] = []

    def StartWorker(self, request, context):
        args = [
            request.control_endpoint.url,
            request.logging_endpoint.url,
            request.provision_endpoint.url,
            request.worker_id,
        ]
        pid = self._forker.start(args)
        if pid is not None:
            self.warm.append(pid)
            return beam_fn_api_pb2.StartWorkerResponse()
        try:
            process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", *args], close_fds=True)
        except Exception as error:  # The runner shows this to the user.
            return beam_fn_api_pb2.StartWorkerResponse(error=str(error))
        self.cold.append(process)
        return beam_fn_api_pb2.StartWorkerResponse()

    def StopWorker(self, request, context):
        self.cold = [p for p in self.cold if p.poll() is None]
        self.warm = [pid for pid in self.warm if _alive(pid)]
        running = len(self.cold) + len(self.warm)
        logging.info("worker %s released; %d workers still running", request.worker_id, running)
        return beam_fn_api_pb2.StopWorkerResponse()


def main(host: str, port: int) -> None:
    # Workers and their children start `python` from PATH: the pool's interpreter first.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    logging.basicConfig(level=logging.INFO)
    forker = _Forker()  # before the server: the forker must never hold gRPC's threads
    server = grpc.server(
        thread_pool_executor.shared_unbounded_instance(),
        options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)],
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        sys.exit(f"worker pool: cannot bind {host}:{port}")
    pool = SharedWorkerPool(forker)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.start()
    logging.info("worker pool listening on %s:%d", host, bound)
    try:
        while True:
            time.sleep(3600)
    finally:
        for proc in pool.cold:
            worker_pool_main.kill_process_gracefully(proc)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(*sys.argv[2:6])
    else:
        main(sys.argv[1], int(sys.argv[2]))

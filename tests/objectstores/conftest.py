"""Real object stores on loopback for the storage tests: MinIO (s3://) and fake-gcs-server (gs://).

Both are built from their pinned Go modules by .ci/install_object_stores.sh the first time
(about 8 and 2 minutes on 2 cores; ./run_tests.sh does it before the first test) and cached; a
machine without Go fails these tests with that reason, it never skips them. Every server is
stopped when its fixture ends, even after a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.cluster.conftest import free_port, port_open
from tests.conftest import in_process, prerequisite_missing
from tests.photos import make_test_tree

REPO = pathlib.Path(__file__).resolve().parents[2]
INSTALL = REPO / ".ci" / "install_object_stores.sh"
# The test tree has 7 broken files among 43 inputs: far above the job's default bad-input limit.
JOB_FLAGS = ["--image_size", "64", "--num_shards", "3", "--max_bad_fraction", "0.5"]


# A build inside a test must end before pytest.ini's per-test limit (900 s) kills it without a
# word; ./run_tests.sh builds the servers before the first test, with a limit of its own.
_BUILD_IN_TEST_TIMEOUT_S = 840


def server_binary(name: str) -> str:
    """The server's binary, built first if missing (idempotent; the build's output is shown on
    failure). When ./run_tests.sh's set-up could not build it, that set-up's line is the failure."""
    missing = prerequisite_missing("object-stores")
    if missing:
        pytest.fail(missing)
    try:
        proc = subprocess.run([str(INSTALL), name], capture_output=True, text=True, timeout=_BUILD_IN_TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{INSTALL.name} {name} did not finish within {_BUILD_IN_TEST_TIMEOUT_S} s inside a test: the first "
            f"build takes minutes; ./run_tests.sh builds it before the tests, or run {INSTALL.relative_to(REPO)} first"
        )
    if proc.returncode != 0:
        pytest.fail(f"{INSTALL.name} {name} could not build the server these tests need:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _wait_http(url: str, process: subprocess.Popen, log: pathlib.Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{url}: the server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _wait_port(port: int, process: subprocess.Popen, log: pathlib.Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"port {port}: the process exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        if port_open(port):
            return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_job(
    *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m beam_jobs ARGS`` in a fresh process, this venv first on PATH (for the workers)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "beam_jobs", *in_process([str(a) for a in args])],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}")
    return proc


@dataclasses.dataclass
class Minio:
    """A MinIO server on loopback, its root credentials (random, so a leak is findable) and a client."""

    endpoint: str
    access_key: str
    secret_key: str
    data_dir: pathlib.Path
    log: pathlib.Path

    def client(self, **credentials):
        import boto3  # pylint: disable=import-outside-toplevel

        credentials = credentials or {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key}
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **credentials)

    def job_flags(
        self, *, access_key: str | None = None, secret_key: str | None = None, session_token: str | None = None
    ) -> list[str]:
        """Beam's S3 options: the endpoint and keys the job and its workers use."""
        flags = [
            "--s3_endpoint_url",
            self.endpoint,
            "--s3_region_name",
            "us-east-1",
            "--s3_access_key_id",
            access_key or self.access_key,
            "--s3_secret_access_key",
            secret_key or self.secret_key,
        ]
        return flags + (["--s3_session_token", session_token] if session_token else [])

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        paginator = self.client().get_paginator("list_objects_v2")
        return sorted(
            o["Key"] for page in paginator.paginate(Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])
        )

    def unfinished_uploads(self, bucket: str) -> list[str]:
        """Multipart uploads begun and never completed nor aborted: invisible litter that costs storage."""
        return sorted(u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []))

    def read_only_credentials(self) -> dict[str, str]:
        """Temporary credentials (STS AssumeRole) whose session policy allows reading and listing only.

        MinIO evaluates them against its IAM policy engine, as it would a read-only user's; STS
        needs no admin client (mc) to set up.
        """
        return self.session_credentials(["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"])

    def session_credentials(self, actions: list[str]) -> dict[str, str]:
        """Temporary credentials (STS AssumeRole, with a session token) allowed ``actions`` only."""
        import boto3  # pylint: disable=import-outside-toplevel

        sts = boto3.client(
            "sts",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": ["arn:aws:s3:::*"]}],
        }
        credentials = sts.assume_role(
            RoleArn="arn:minio:iam:::role/read-only",
            RoleSessionName="session",
            Policy=json.dumps(policy),
            DurationSeconds=3600,
        )["Credentials"]
        return {
            "access_key": credentials["AccessKeyId"],
            "secret_key": credentials["SecretAccessKey"],
            "session_token": credentials["SessionToken"],
        }


@pytest.fixture(scope="session")
def minio(tmp_path_factory):
    binary = server_binary("minio")
    root = tmp_path_factory.mktemp("minio")
    port, console = free_port(), free_port()
    server = Minio(
        endpoint=f"http://127.0.0.1:{port}",
        access_key="itt" + secrets.token_hex(8),
        # Never starting with "-": the tests pass it as "--s3_secret_access_key VALUE", which
        # argparse reads as a flag when it does (1 run in 64 failed every S3 test so).
        secret_key="s" + secrets.token_urlsafe(24),
        data_dir=root / "data",
        log=root / "minio.log",
    )
    env = {
        **os.environ,
        "MINIO_ROOT_USER": server.access_key,
        "MINIO_ROOT_PASSWORD": server.secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                "server",
                "--quiet",
                "--address",
                f"127.0.0.1:{port}",
                "--console-address",
                f"127.0.0.1:{console}",
                str(server.data_dir),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_http(f"{server.endpoint}/minio/health/ready", process, server.log)
        yield server
    finally:
        _stop(process)


@dataclasses.dataclass
class FakeGcs:
    """fake-gcs-server on loopback (in memory) and the environment that points GCS clients at it."""

    endpoint: str
    log: pathlib.Path

    @property
    def env(self) -> dict[str, str]:
        # google-cloud-storage (Beam's GCS filesystem) sends every call here, with anonymous credentials.
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def client(self):
        from google.auth.credentials import AnonymousCredentials  # pylint: disable=import-outside-toplevel
        from google.cloud import storage  # pylint: disable=import-outside-toplevel

        return storage.Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": self.endpoint}
        )

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        return sorted(blob.name for blob in self.client().list_blobs(bucket, prefix=prefix))


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory):
    binary = server_binary("fake-gcs-server")
    root = tmp_path_factory.mktemp("fake-gcs")
    port = free_port()
    server = FakeGcs(endpoint=f"http://127.0.0.1:{port}", log=root / "fake-gcs.log")
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_http(f"{server.endpoint}/storage/v1/b", process, server.log)
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def messy_tree(tmp_path_factory) -> pathlib.Path:
    """The project's messy test tree: 36 real photos in 9 classes, 7 broken files, 2 to ignore."""
    root = tmp_path_factory.mktemp("store-photos") / "tree"
    make_test_tree(root, num_images=36)
    return root


@pytest.fixture(scope="session")
def local_reference(messy_tree, tmp_path_factory) -> pathlib.Path:
    """The same conversion on local disk: what every store run must reproduce byte for byte."""
    out = tmp_path_factory.mktemp("store-reference") / "out"
    run_job("--input", messy_tree, "--output_dir", out, *JOB_FLAGS)
    return out


def local_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())

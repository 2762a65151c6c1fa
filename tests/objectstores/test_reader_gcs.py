"""The reader on gs://, through TensorFlow's own GCS client, against fake-gcs-server.

TensorFlow's client cannot be pointed at an emulator directly (its endpoints are compiled in), so
the test gives it what a corporate network would: HTTPS_PROXY names a CONNECT tunnel to
fake-gcs-server, which serves TLS with a certificate for www.googleapis.com and
storage.googleapis.com from a test CA named by CURL_CA_BUNDLE, and GOOGLE_AUTH_TOKEN_FOR_TESTING
(TensorFlow's own test hook) stands in for credentials. The client's requests are the ones it
sends to Google; only the network path differs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from tests.cluster.conftest import free_port
from tests.objectstores.conftest import REPO, _stop, _wait_port, server_binary

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def _test_ca(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """(CA certificate, server certificate, server key), made with openssl for this run only."""

    def openssl(*args: str) -> None:
        proc = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"openssl {args[0]} failed: {proc.stderr.strip()[-500:]}")

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=images-to-tfrecords test CA",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=storage.googleapis.com",
    )
    (folder / "ext").write_text(
        "subjectAltName=DNS:www.googleapis.com,DNS:storage.googleapis.com,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext",
    )
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@pytest.fixture(scope="module")
def gcs_over_tls(tmp_path_factory):
    """(environment for TensorFlow, https endpoint, CA) of fake-gcs-server behind a CONNECT tunnel."""
    binary = server_binary("fake-gcs-server")
    root = tmp_path_factory.mktemp("gcs-tls")
    ca, cert, key = _test_ca(root)
    port, proxy_port = free_port(), free_port()
    with (root / "fake-gcs.log").open("wb") as log:
        server = subprocess.Popen(
            [
                binary,
                "-scheme",
                "https",
                "-cert-location",
                str(cert),
                "-private-key-location",
                str(key),
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-public-host",
                "storage.googleapis.com",
                "-log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    with (root / "tunnel.log").open("wb") as log:
        tunnel = subprocess.Popen(
            [sys.executable, "-m", "tests.objectstores.connect_tunnel", str(proxy_port), str(port)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_port(port, server, root / "fake-gcs.log")
        _wait_port(proxy_port, tunnel, root / "tunnel.log")
        env = {
            "HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}",
            "CURL_CA_BUNDLE": str(ca),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
        }
        yield env, f"https://127.0.0.1:{port}", ca
    finally:
        _stop(tunnel)
        _stop(server)


def test_reader_reads_and_verifies_a_dataset_on_gcs(gcs_over_tls, local_reference, monkeypatch):
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=import-outside-toplevel
    from google.cloud import storage  # pylint: disable=import-outside-toplevel

    env, endpoint, ca = gcs_over_tls
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))  # the upload below trusts the test CA too
    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    bucket = client.create_bucket(f"read-{uuid.uuid4().hex[:8]}")
    for path in sorted(p for p in local_reference.rglob("*") if p.is_file()):
        bucket.blob(f"out/{path.relative_to(local_reference).as_posix()}").upload_from_filename(str(path))
    shard = json.loads((local_reference / "dataset_info.json").read_text())["splits"]["train"]["shards"][1]["file"]

    script = (
        "import sys, tfdata_readers as tfr\n"
        "data = sys.argv[1]\n"
        "print('problems', tfr.verify(data))\n"
        "print('examples', sum(int(labels.shape[0]) for _, labels in tfr.make_dataset(data, 'train', 8, "
        "training=False)))\n"
        "print('steps', tfr.steps_per_epoch(data, 'train', 8))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, f"gs://{bucket.name}/out"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["problems []", "examples 36", "steps 4"], proc.stdout

    # The same reads with a shard gone: the reader's start-up check names it, on gs:// too.
    bucket.blob(f"out/{shard}").delete()
    proc = subprocess.run(
        [sys.executable, "-c", script, f"gs://{bucket.name}/out"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "train-00001-of-00003.tfrecord" in proc.stdout + proc.stderr

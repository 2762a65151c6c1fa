"""s3:// end to end on a real MinIO server: store to store on the local runner, byte-identical to the
local-disk run, nothing left in the bucket, a SIGKILL then --resume, a read-only identity refused
before any work, and no credential in any output."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.objectstores.conftest import JOB_FLAGS, REPO, local_files, run_job
from tests.objectstores.stores import assert_matches_local, assert_no_secret, dataset_names, normalise_names

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

# A clean tree big enough that a kill lands while shards are being staged.
KILL_FLAGS = ["--image_size", "64", "--num_shards", "6"]


def _upload(minio, bucket: str, prefix: str, root: pathlib.Path) -> None:
    client = minio.client()
    for path in local_files(root):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def _download(minio, bucket: str, prefix: str) -> dict[str, bytes]:
    client = minio.client()
    return {
        key[len(prefix) + 1 :]: client.get_object(Bucket=bucket, Key=key)["Body"].read()
        for key in minio.keys(bucket, prefix + "/")
    }


@pytest.fixture(scope="module")
def bucket(minio, messy_tree) -> str:
    """A fresh bucket holding the messy tree under tree/."""
    name = f"imgs-{uuid.uuid4().hex[:8]}"
    minio.client().create_bucket(Bucket=name)
    _upload(minio, name, "tree", messy_tree)
    return name


def test_store_to_store_matches_local_disk_and_leaves_nothing_else(minio, bucket, messy_tree, local_reference):
    tree_keys = minio.keys(bucket, "tree/")
    result = run_job(
        "--input",
        f"s3://{bucket}/tree",
        "--output_dir",
        f"s3://{bucket}/out",
        *JOB_FLAGS,
        *minio.job_flags(),
        "--log_level",
        "INFO",
    )
    got = _download(minio, bucket, "out")
    assert_matches_local(
        got,
        local_reference,
        input_root=f"s3://{bucket}/tree",
        output_root=f"s3://{bucket}/out",
        reference_input=str(messy_tree),
    )
    # Nothing beyond the dataset: the input is untouched, and no temp, staged, probe or lock object
    # (nor an unfinished multipart upload) is left anywhere in the bucket.
    assert sorted(map(normalise_names, minio.keys(bucket))) == sorted(
        tree_keys + [f"out/{name}" for name in dataset_names(local_reference)]
    )
    assert minio.unfinished_uploads(bucket) == []
    assert "wrote train: 36 examples in 3 shards" in result.stdout
    assert_no_secret(
        [minio.secret_key, minio.access_key],
        stdout=result.stdout,
        stderr=result.stderr,
        **{f"s3://{bucket}/out/{name}": data for name, data in got.items()},
    )


def test_credentials_are_not_in_any_error(minio, bucket):
    """A failing run prints its error (with the store's own message); it never echoes the keys."""
    result = run_job(
        "--input",
        f"s3://{bucket}/no-such-tree",
        "--output_dir",
        f"s3://{bucket}/never",
        *JOB_FLAGS,
        *minio.job_flags(),
        "--log_level",
        "DEBUG",
        check=False,
    )
    assert result.returncode == 2
    assert f"--input s3://{bucket}/no-such-tree: no files found under it" in result.stderr
    assert_no_secret([minio.secret_key], stdout=result.stdout, stderr=result.stderr)
    assert minio.keys(bucket, "never/") == []


def test_a_missing_bucket_is_named_as_such(minio, bucket):
    result = run_job(
        "--input",
        "s3://no-such-bucket-here/tree",
        "--output_dir",
        f"s3://{bucket}/never2",
        *JOB_FLAGS,
        *minio.job_flags(),
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "images-to-tfrecords: error: --input s3://no-such-bucket-here/tree: bucket no-such-bucket-here does not exist"
    ]


def test_read_only_identity_fails_before_any_work(minio, bucket):
    read_only = minio.read_only_credentials()
    result = run_job(
        "--input",
        f"s3://{bucket}/tree",
        "--output_dir",
        f"s3://{bucket}/read-only-out",
        *JOB_FLAGS,
        *minio.job_flags(**read_only),
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"images-to-tfrecords: error: cannot write to --output_dir s3://{bucket}/read-only-out: ")
    assert "Access Denied" in line or "AccessDenied" in line, line
    # Refused before the pipeline was built: its one line, and no converting line. A clock would
    # say the same on an idle machine and flip on a cold, busy one (Python and Beam starting).
    assert "converting" not in result.stderr
    assert minio.keys(bucket, "read-only-out/") == []
    assert minio.unfinished_uploads(bucket) == []
    assert_no_secret(list(read_only.values()) + [minio.secret_key], stdout=result.stdout, stderr=result.stderr)


def test_kill_then_resume_on_the_store_gives_byte_identical_output(minio, tmp_path_factory):
    """SIGKILL while shards are being written in the bucket, then --resume: nothing committed, and
    the result is byte for byte the uninterrupted local-disk run's (shards; manifests once the
    commit's own facts are set aside)."""
    root = tmp_path_factory.mktemp("kill-photos") / "tree"
    make_photo_tree(root, num_images=120, seed=21)
    reference = tmp_path_factory.mktemp("kill-reference") / "out"
    run_job("--input", root, "--output_dir", reference, *KILL_FLAGS)
    name = f"kill-{uuid.uuid4().hex[:8]}"
    minio.client().create_bucket(Bucket=name)
    _upload(minio, name, "tree", root)
    args = ["--input", f"s3://{name}/tree", "--output_dir", f"s3://{name}/out", *KILL_FLAGS, *minio.job_flags()]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", *args],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 400  # Only reached when something is wrong: a cold machine is slow.
        staged: list[str] = []
        while time.monotonic() < deadline and process.poll() is None and not staged:
            staged = [k for k in minio.keys(name, "out/shards/") if k.rsplit("/", 1)[-1].startswith(".train-")]
            time.sleep(0.05)
        assert staged, "the job finished (or timed out) before any shard was staged"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # Nothing committed: no manifest, and every object under a final shard name in the run's
    # folder is complete (uploads become visible only once whole).
    assert "out/dataset_info.json" not in minio.keys(name, "out/")

    run_job(*args, "--resume")
    got = _download(minio, name, "out")
    assert_matches_local(
        got, reference, input_root=f"s3://{name}/tree", output_root=f"s3://{name}/out", reference_input=str(root)
    )
    # Not checked here: a shard whose upload the kill cut short stays an unfinished multipart
    # upload (Beam's S3 writer cannot abort it once killed); a bucket lifecycle rule removes those.


def test_keys_with_question_marks_and_hashes_are_images_and_debug_logs_hide_credentials(minio, tmp_path_factory):
    """ "?" and "#" are ordinary characters of an S3 key (no query, no fragment): every image under
    such a name becomes an example. Run at --log_level DEBUG with temporary credentials: neither
    the secret key nor the session token appears in the output (the workers' option line and
    botocore's signed headers used to print them)."""
    photos = tmp_path_factory.mktemp("odd-keys") / "tree"
    make_photo_tree(photos, num_images=6, seed=5)
    images = [path for path in local_files(photos) if path.suffix == ".jpg"][:6]
    keys = [
        "odd/cats/a?b.jpg",
        "odd/cats/c#d.jpg",
        "odd/dogs?/x[1].jpg",
        "odd/dogs?/y.jpg",
        "odd/dogs#/1.jpg",
        "odd/dogs#/2.jpg",
    ]
    name = f"odd-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=name)
    for key, path in zip(keys, images, strict=True):
        client.upload_file(str(path), name, key)
    session = minio.session_credentials(["s3:*"])
    result = run_job(
        "--input",
        f"s3://{name}/odd",
        "--output_dir",
        f"s3://{name}/out",
        "--image_size",
        "16",
        "--num_shards",
        "1",
        *minio.job_flags(**session),
        "--log_level",
        "DEBUG",
    )
    info = json.loads(client.get_object(Bucket=name, Key="out/dataset_info.json")["Body"].read())
    assert info["label_names"] == ["cats", "dogs#", "dogs?"]
    assert info["splits"]["train"]["num_examples"] == 6, info["splits"]
    assert_no_secret(
        [session["secret_key"], session["session_token"], minio.secret_key], stdout=result.stdout, stderr=result.stderr
    )


def test_an_endpoint_that_refuses_connections_fails_in_seconds(minio, bucket):
    """A wrong port used to mean minutes of retries with tracebacks before a wrapped error."""
    with socket.socket() as closed:  # a port nobody listens on: bound, never listening
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        flags = minio.job_flags()
        flags[flags.index("--s3_endpoint_url") + 1] = f"http://127.0.0.1:{port}"
        result = run_job(
            "--input", f"s3://{bucket}/tree", "--output_dir", f"s3://{bucket}/refused", *JOB_FLAGS, *flags, check=False
        )
    # The one line below comes only from the up-front reachability check, which runs before Beam's
    # retrying S3 client is used at all; that, not a clock, shows no minutes of retries were spent.
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"images-to-tfrecords: error: cannot reach --s3_endpoint_url http://127.0.0.1:{port}: connection refused"
    ]

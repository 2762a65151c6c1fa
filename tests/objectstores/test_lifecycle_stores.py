"""The dataset lifecycle on an object store (MinIO): a kill at any instant of a run's last step
leaves one whole version current, and --append and a rollback on s3:// keep old shards untouched.

The reader on s3:// is not part of TensorFlow's own filesystems, so the state after each kill is
downloaded and then checked with the same checks as on local disk (verify, reader, manifest)."""

from __future__ import annotations

import json
import pathlib
import random
import time

import pytest

from tests.lifecycle.checks import examples_of_manifest, examples_read, manifest, verify_clean
from tests.lifecycle.states import build_three_states, start_finalize_child
from tests.objectstores.conftest import run_job

pytestmark = [pytest.mark.slow]

KILLS = 10
BUCKET = "lifecycle"


def _upload(minio, folder: pathlib.Path, prefix: str) -> None:
    client = minio.client()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def _copy(minio, source: str, target: str) -> None:
    client = minio.client()
    for key in minio.keys(BUCKET, source + "/"):
        client.copy_object(Bucket=BUCKET, Key=target + key[len(source) :], CopySource={"Bucket": BUCKET, "Key": key})


def _download(minio, prefix: str, folder: pathlib.Path) -> pathlib.Path:
    client = minio.client()
    for key in minio.keys(BUCKET, prefix + "/"):
        path = folder / key[len(prefix) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(path))
    return folder


@pytest.fixture(scope="module")
def store_states(minio, tmp_path_factory):
    template, args, old, new = build_three_states(tmp_path_factory.mktemp("store-kills"))
    client = minio.client()
    if BUCKET not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=BUCKET)
    _upload(minio, template, "template")
    return args, old, new


@pytest.mark.timeout(1800)
def test_a_kill_at_any_instant_of_the_commit_on_s3_leaves_one_whole_version(minio, store_states, tmp_path):
    args, old, new = store_states
    flags = minio.job_flags()
    _copy(minio, "template", "timed")
    child = start_finalize_child(args, f"s3://{BUCKET}/timed", tmp_path, flags)
    began = time.monotonic()
    child.stdin.write("go\n")
    child.stdin.flush()
    # When the root object changes (the commit): half the kills go within twice that time, half
    # over the whole step (its clean-up and gc take most of it), so both outcomes occur.
    client, committed_after = minio.client(), None
    while committed_after is None and child.poll() is None:
        body = client.get_object(Bucket=BUCKET, Key="timed/dataset_info.json")["Body"].read()
        if json.loads(body)["version"] == 3:
            committed_after = time.monotonic() - began
    assert child.stdout.readline().strip() == "done"
    window = (time.monotonic() - began) * 1.2
    committed_after = committed_after if committed_after is not None else window / 2
    assert child.wait(timeout=120) == 0
    timed = _download(minio, "timed", tmp_path / "timed")
    assert manifest(timed)["version"] == 3 and examples_of_manifest(timed, manifest(timed)) == new
    rng = random.Random(7)
    outcomes = {2: 0, 3: 0}
    for kill in range(KILLS):
        prefix = f"kill-{kill}"
        _copy(minio, "template", prefix)
        child = start_finalize_child(args, f"s3://{BUCKET}/{prefix}", tmp_path, flags)
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(rng.uniform(0, 2 * committed_after if kill % 2 == 0 else window))
        child.kill()
        child.wait()
        local = _download(minio, prefix, tmp_path / prefix)
        info = manifest(local)
        assert info["version"] in (2, 3), info["version"]
        outcomes[info["version"]] += 1
        verify_clean(local)
        assert examples_read(local) == (old if info["version"] == 2 else new)
        # Version 2's files stay whichever version is current: a trainer that opened it reads it whole.
        version_2 = json.loads((local / "versions" / "00000002.json").read_text())
        assert examples_of_manifest(local, version_2) == old
        assert minio.unfinished_uploads(BUCKET) == []
    assert outcomes[2] and outcomes[3], outcomes


def test_append_and_rollback_on_s3_keep_old_shards_untouched(minio, store_states, tmp_path):
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    src = tmp_path / "src"
    make_photo_tree(src, num_images=12, seed=2)
    out = f"s3://{BUCKET}/append"
    flags = ["--image_size", "24", "--num_shards", "2", *minio.job_flags()]
    run_job("--input", str(src), "--output_dir", out, *flags)
    first = _download(minio, "append", tmp_path / "first")
    v1 = manifest(first)
    old = {s["file"]: (first / s["file"]).read_bytes() for split in v1["splits"].values() for s in split["shards"]}
    for photo in sorted(make_photo_tree(tmp_path / "more", num_images=4, seed=8)):
        target = src / photo.parent.name / f"more-{photo.name}"
        photo.rename(target)
    run_job("--input", str(src), "--output_dir", out, *flags, "--append")
    second = _download(minio, "append", tmp_path / "second")
    v2 = manifest(second)
    assert (v2["version"], v2["change"]["kind"], sum(v2["change"]["added"].values())) == (2, "append", 4)
    assert {name: (second / name).read_bytes() for name in old} == old  # untouched, byte for byte
    assert sum(examples_read(second).values()) == 16
    verify_clean(second)
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    rolled = subprocess.run(
        [sys.executable, "-m", "beam_jobs.versions", out, "rollback", "1", *minio.job_flags()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rolled.returncode == 0, rolled.stderr
    third = _download(minio, "append", tmp_path / "third")
    assert manifest(third)["version"] == 3 and examples_read(third) == examples_read(first)


def test_overwrite_append_rollback_and_gc_on_gcs(fake_gcs, tmp_path):
    """The same lifecycle on gs:// (fake-gcs-server): each version whole, old shards untouched,
    and the files of versions outside the window collected after a commit."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    client = fake_gcs.client()
    bucket = client.create_bucket("lifecycle-gcs")
    src = tmp_path / "src"
    make_photo_tree(src, num_images=10, seed=6)
    out = f"gs://{bucket.name}/data"
    flags = ["--image_size", "24", "--project", "test"]

    def download(name: str) -> pathlib.Path:
        folder = tmp_path / name
        for blob_name in fake_gcs.names(bucket.name, "data/"):
            path = folder / blob_name[len("data/") :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bucket.blob(blob_name).download_as_bytes())
        return folder

    run_job("--input", str(src), "--output_dir", out, *flags, "--num_shards", "2", env=fake_gcs.env)
    first = download("v1")
    run_job("--input", str(src), "--output_dir", out, *flags, "--num_shards", "3", "--overwrite", env=fake_gcs.env)
    for photo in sorted(make_photo_tree(tmp_path / "more", num_images=3, seed=12)):
        photo.rename(src / photo.parent.name / f"more-{photo.name}")
    run_job("--input", str(src), "--output_dir", out, *flags, "--num_shards", "3", "--append", env=fake_gcs.env)
    third = download("v3")
    info = manifest(third)
    assert (info["version"], info["change"]["kind"], sum(info["change"]["added"].values())) == (3, "append", 3)
    verify_clean(third)
    assert sum(examples_read(third).values()) == 13
    # Version 1's shards left the store with the third commit (two versions kept); its manifest stays.
    v1 = manifest(first)
    names = set(fake_gcs.names(bucket.name, "data/"))
    assert not {f"data/{s['file']}" for split in v1["splits"].values() for s in split["shards"]} & names
    assert "data/versions/00000001.json" in names
    rolled = subprocess.run(
        [sys.executable, "-m", "beam_jobs.versions", out, "rollback", "2"],
        env={**__import__("os").environ, **fake_gcs.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rolled.returncode == 0, rolled.stderr
    fourth = download("v4")
    assert manifest(fourth)["version"] == 4 and sum(examples_read(fourth).values()) == 10
    verify_clean(fourth)

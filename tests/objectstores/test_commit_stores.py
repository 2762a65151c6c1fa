"""Versioned commits on real object stores: MinIO (s3://) and fake-gcs-server (gs://).

First the servers' own preconditions, through the same clients commit.py uses (Beam's): a commit
is only as safe as the store's refusal of a stale conditional write, so that refusal is checked
here, not assumed. Then racing committers, committers SIGKILLed around the root write, and a
commit, a rollback and a gc of a dataset on each store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.errors import JobError
from beam_jobs.storage import connect_anonymously_to_a_gcs_emulator
from beam_jobs.versions import collect_garbage, history, load_version, rollback, shard_files
from beam_jobs.writing import commit
from beam_jobs.writing.commit import VERSION_KEYS, commit_version, read_current, version_file
from tests.versions.arrange import RUN_A, RUN_KILLED, convert_photos, dataset_files, run_content
from tests.versions.committers import assert_consistent, kill_committers, race, race_for_the_run_lock

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@dataclasses.dataclass
class StoreOut:
    """An output folder on a store, the flags Beam's filesystem needs there, and raw object access."""

    uri: str
    flags: list[str]
    put: Callable[[str, bytes], None]  # (path relative to the folder, bytes)
    get: Callable[[str], bytes | None]
    names: Callable[[], list[str]]  # every object under the folder, relative to it


@pytest.fixture
def s3_out(minio) -> StoreOut:
    """A fresh bucket on MinIO, Beam's S3 filesystem pointed at it."""
    bucket = f"commits-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    FileSystems.set_options(PipelineOptions(minio.job_flags()))

    def get(relative: str) -> bytes | None:
        try:
            return client.get_object(Bucket=bucket, Key=f"out/{relative}")["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    return StoreOut(
        uri=f"s3://{bucket}/out",
        flags=minio.job_flags(),
        put=lambda relative, data: client.put_object(Bucket=bucket, Key=f"out/{relative}", Body=data),
        get=get,
        names=lambda: [k[len("out/") :] for k in minio.keys(bucket, "out/")],
    )


@pytest.fixture
def gs_out(fake_gcs, monkeypatch) -> StoreOut:
    """A fresh bucket on fake-gcs-server, Beam's GCS filesystem pointed at it."""
    for name, value in fake_gcs.env.items():
        monkeypatch.setenv(name, value)
    connect_anonymously_to_a_gcs_emulator()  # this process imported the job before the variable was set
    from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

    bucket = fake_gcs.client().create_bucket(f"commits-{uuid.uuid4().hex[:8]}")
    FileSystems.set_options(PipelineOptions(["--project", "test"]))

    def get(relative: str) -> bytes | None:
        try:
            return bucket.blob(f"out/{relative}").download_as_bytes()
        except exceptions.NotFound:
            return None

    return StoreOut(
        uri=f"gs://{bucket.name}/out",
        flags=["--project", "test"],
        put=lambda relative, data: bucket.blob(f"out/{relative}").upload_from_string(data),
        get=get,
        names=lambda: [n[len("out/") :] for n in fake_gcs.names(bucket.name, "out/")],
    )


@pytest.fixture(params=["s3", "gs"])
def store_out(request) -> StoreOut:
    return request.getfixturevalue(f"{request.param}_out")


@pytest.fixture(scope="module")
def job_output(tmp_path_factory):
    """One real conversion on local disk (the flat layout of an older release), to upload."""
    return convert_photos(tmp_path_factory.mktemp("store-versions-job"))


def _check_store_preconditions(out: str) -> None:
    """put-if-absent and put-if-match, as commit.py's store issues them, refused when stale."""
    store = commit._store(out)  # pylint: disable=protected-access
    path = f"{out}/probe.json"
    assert store.read(path)[0] is None
    assert store.write_if_absent(path, b"first")
    assert not store.write_if_absent(path, b"second"), "put-if-absent over an existing object succeeded"
    data, first = store.read(path)
    assert data == b"first"
    assert store.replace_if(path, b"third", first)
    assert not store.replace_if(path, b"fourth", first), "a write conditional on a replaced version succeeded"
    data, third = store.read(path)
    assert data == b"third" and third != first
    absent = store.read(f"{out}/absent.json")[1]
    assert not store.replace_if(path, b"fifth", absent), "a write conditional on absence replaced an object"
    assert store.read(path) == (b"third", third)


def test_minio_enforces_if_none_match_and_if_match(s3_out):
    _check_store_preconditions(s3_out.uri)


def test_fake_gcs_enforces_if_generation_match(gs_out):
    _check_store_preconditions(gs_out.uri)


def test_racing_committer_processes_exactly_one_wins_each_round(store_out):
    rounds = race(store_out.uri, 4, 3, store_flags=store_out.flags)
    for round_number, outcomes in rounds.items():
        won = [name for name, outcome, _ in outcomes if outcome == "won"]
        assert len(won) == 1, outcomes
        assert all(
            outcome == "conflict" and "\n" not in message and f"version {round_number} is current now" in message
            for name, outcome, message in outcomes
            if name not in won
        ), outcomes
        manifest = json.loads(store_out.get(version_file(round_number)))
        assert manifest["author"] == manifest["change"]["run"] == won[0]
    assert [m["version"] for m in history(store_out.uri)] == [3, 2, 1]


def test_runs_starting_at_once_exactly_one_takes_the_run_lock(store_out):
    """The run lock on a store is one conditional create: gc or rollback and a conversion that
    start at the same moment cannot both hold it."""
    outcomes = race_for_the_run_lock(store_out.uri, 4, store_flags=store_out.flags)
    assert [outcome for _, outcome, _ in outcomes].count("locked") == 1, outcomes
    assert all("another run (process" in message for _, outcome, message in outcomes if outcome == "refused")


def test_a_committer_sigkilled_at_random_instants_leaves_one_whole_version(store_out):
    padding, kills = 256 << 10, 8
    states = kill_committers(store_out.uri, kills, padding=padding, seed=20261202, store_flags=store_out.flags)
    print(f"{store_out.uri}: states after {kills} kills: {states}")
    version = assert_consistent(store_out.uri, padding=padding)
    # The next commit writes the history copy a kill may have left missing.
    from tests.versions.committers import content  # pylint: disable=import-outside-toplevel

    commit_version(
        store_out.uri,
        content(version + 1, padding=padding),
        expected=read_current(store_out.uri),
        change={"kind": "overwrite", "run": None},
    )
    assert assert_consistent(store_out.uri, padding=padding) == version + 1
    assert store_out.get(version_file(version)) is not None


def test_commit_rollback_and_gc_on_the_store(store_out, job_output):
    """The job's flat output uploaded (version 1), run A's copies committed over it (2), a rollback
    to 1 (3), then gc with a window of 1: run A's folder and a killed run's go, the flat files
    version 3 lists stay whole, and so does the user's file."""
    for path in dataset_files(job_output):
        store_out.put(path.name, path.read_bytes())
    store_out.put("notes.txt", b"the user's notes")
    store_out.put(f"shards/{RUN_KILLED}/train-00000-of-00002.tfrecord", b"a killed run's partial shard")
    legacy = json.loads((job_output / "dataset_info.json").read_bytes())
    assert read_current(store_out.uri).version == 1
    committed = commit_version(
        store_out.uri,
        run_content(job_output, RUN_A, store_out.put),
        expected=read_current(store_out.uri),
        change={"kind": "overwrite", "run": RUN_A},
    )
    assert (committed["version"], committed["parent_version"]) == (2, 1)
    assert store_out.get(version_file(1)) == (job_output / "dataset_info.json").read_bytes()
    back = rollback(store_out.uri, 1)
    assert (back["version"], back["change"]) == (3, {"kind": "rollback", "run": None, "rolled_back_to": 1})
    assert {k: v for k, v in back.items() if k not in VERSION_KEYS} == legacy
    assert [m["version"] for m in history(store_out.uri)] == [3, 2, 1]
    before = set(store_out.names())
    run_a = sorted(name for name in before if name.startswith(f"shards/{RUN_A}/"))
    assert len(run_a) == 9  # 4 shards, 4 sidecars, the dead letters
    deleted = collect_garbage(store_out.uri, keep=1)
    assert deleted == sorted(run_a + [f"shards/{RUN_KILLED}/train-00000-of-00002.tfrecord"])
    assert set(store_out.names()) == before - set(deleted)
    for name in shard_files(load_version(store_out.uri)):
        data = store_out.get(name)
        shard = next(s for f in back["splits"].values() for s in f["shards"] if s["file"] == name)
        assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["bytes"], shard["sha256"])
    assert store_out.get("notes.txt") == b"the user's notes"
    assert store_out.get(".images-to-tfrecords.lock") is None  # gc released the run lock
    with pytest.raises(JobError, match="to version 2: 4 of its 4 shard files are gone"):
        rollback(store_out.uri, 2)

"""Versions of a real dataset (beam_jobs/versions/): history, reading an old version, rollback,
gc under the run lock, and the CLI.

The dataset is one real conversion of real photos by the current job (the flat layout of a
release before versioning: version 1), then version 2 (run A: copies of all its shards under
shards/A/) and version 3 (run B: one shard per split under shards/B/), committed with
commit_version; beside them a killed run's leftovers under shards/ and two files of the user's.
Reads go through the real reader (tfdata_readers.make_dataset) wherever the reader on main
accepts the folder: it refuses shard-named files beside dataset_info.json that the root manifest
does not list, so a version listing a subset under shards/ is read with it only once gc removed
the flat layout's files; elsewhere the files are checked against the manifest's sha256s.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from beam_jobs.errors import JobError
from beam_jobs.versions import (
    VersionNotFoundError,
    collect_garbage,
    history,
    kept_versions,
    load_version,
    rollback,
    shard_files,
)
from beam_jobs.writing.commit import VERSION_KEYS, commit_version, read_current, version_file
from beam_jobs.writing.run_lock import LOCK_NAME, OutputLockedError, acquire_output_lock, release_output_lock
from tests.versions.arrange import REPO, RUN_A, RUN_B, RUN_KILLED, convert_photos, local_put, record_keys, run_content

pytestmark = pytest.mark.slow

KILLED_LEFTOVERS = [
    f"shards/{RUN_KILLED}/.tmp-0123abcd-validation-00000-of-00002.tfrecord",
    f"shards/{RUN_KILLED}/train-00000-of-00002.tfrecord",
]
USER_FILES = ["export-00000-of-00001.tfrecord", "notes.txt"]


@pytest.fixture(scope="module")
def job_output(tmp_path_factory) -> pathlib.Path:
    return convert_photos(tmp_path_factory.mktemp("versions-job"))


@pytest.fixture
def out(tmp_path, job_output) -> pathlib.Path:
    """Versions 1 (the job's flat output), 2 (run A) and 3 (run B), a killed run, the user's files."""
    out = tmp_path / "out"
    shutil.copytree(job_output, out)
    put = local_put(out)
    for run, shards in ((RUN_A, None), (RUN_B, 1)):
        commit_version(
            str(out),
            run_content(job_output, run, put, shards_per_split=shards),
            expected=read_current(str(out)),
            change={"kind": "overwrite", "run": run},
        )
    for name in KILLED_LEFTOVERS:
        put(name, b"a killed run's partial shard")
    put(USER_FILES[0], b"the user's own export")
    put(USER_FILES[1], b"the user's notes")
    return out


def _files(out: pathlib.Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def _content(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k not in VERSION_KEYS}


def _assert_files_intact(out: pathlib.Path, manifest: dict) -> None:
    """Every shard of the version is there with its manifest's size and sha256."""
    for facts in manifest["splits"].values():
        for shard in facts["shards"]:
            data = (out / shard["file"]).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["bytes"], shard["sha256"]), shard["file"]


def _version_keys(out: pathlib.Path, manifest: dict, split: str) -> list[str]:
    return sorted(key for name in shard_files(manifest, split) for key in record_keys((out / name).read_bytes()))


def _reader_keys(out: pathlib.Path, split: str) -> list[str]:
    import tfdata_readers  # pylint: disable=import-outside-toplevel

    dataset = tfdata_readers.make_dataset(str(out), split, 64, with_metadata=True)
    return sorted(key.decode() for *_, meta in dataset for key in meta["key"].numpy())


def _cli(*args, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "beam_jobs.versions", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_history_lists_versions_newest_first_and_each_loads(out, job_output):
    legacy = json.loads((job_output / "dataset_info.json").read_text())
    chain = history(str(out))
    assert [(m["version"], m["parent_version"]) for m in chain] == [(3, 2), (2, 1), (1, None)]
    assert [m["change"]["run"] for m in chain[:2]] == [RUN_B, RUN_A]
    assert _content(chain[2]) == legacy  # The flat dataset of an older release is version 1.
    assert load_version(str(out)) == chain[0] == json.loads((out / "dataset_info.json").read_text())
    assert load_version(str(out), 1)["splits"] == legacy["splits"]
    assert (
        load_version(str(out), 2)["splits"]["train"]["shards"][0]["file"]
        == f"shards/{RUN_A}/train-00000-of-00002.tfrecord"
    )
    for missing in (4, 0):
        with pytest.raises(VersionNotFoundError) as refused:
            load_version(str(out), missing)
        assert str(refused.value) == f"version {missing} is not kept in {out}; kept versions: 3, 2, 1"
    assert kept_versions(str(out), 2) == [3, 2]
    assert kept_versions(str(out), 9) == [3, 2, 1]
    with pytest.raises(ValueError, match="at least 1"):
        kept_versions(str(out), 0)


def test_rollback_commits_an_old_versions_content_and_copies_nothing(out):
    before = _files(out)
    v2 = load_version(str(out), 2)
    committed = rollback(str(out), 2)
    assert (committed["version"], committed["parent_version"]) == (4, 3)
    assert committed["change"] == {"kind": "rollback", "run": None, "rolled_back_to": 2}
    assert _content(committed) == _content(v2)
    assert _files(out) == before | {version_file(4)}  # The same shard files: nothing copied.
    assert not (out / LOCK_NAME).exists()  # The run lock was released.
    for split in ("train", "validation"):
        assert _reader_keys(out, split) == _version_keys(out, v2, split)
    with pytest.raises(JobError, match="version 4 is already the current version"):
        rollback(str(out), 4)
    # Back to the flat layout of version 1: the reader reads its files beside dataset_info.json.
    committed = rollback(str(out), 1)
    assert committed["version"] == 5 and _content(committed) == _content(load_version(str(out), 1))
    assert _reader_keys(out, "train") == _version_keys(out, committed, "train")
    assert [m["version"] for m in history(str(out))] == [5, 4, 3, 2, 1]


def test_gc_deletes_exactly_what_no_kept_version_lists(out):
    flat = sorted(shard_files(load_version(str(out), 1))) + ["dead_letters.jsonl"]
    before = _files(out)
    deleted = collect_garbage(str(out), keep=2)
    # Version 1's flat files (only it lists them) and the killed run's folder; nothing else.
    assert deleted == sorted(flat + KILLED_LEFTOVERS)
    assert _files(out) == before - set(deleted)
    assert not (out / "shards" / RUN_KILLED).exists()
    for name in USER_FILES + [version_file(1), version_file(2), version_file(3), ".commit.lock"]:
        assert (out / name).exists(), name
    for version in (3, 2):
        _assert_files_intact(out, load_version(str(out), version))
    assert not (out / LOCK_NAME).exists()
    # The flat files are gone, so the reader on main reads version 3 (one shard a split) now.
    v3 = load_version(str(out))
    assert _reader_keys(out, "train") == _version_keys(out, v3, "train")
    # Version 1's manifest is kept, its files are not: a rollback to it is refused, changing nothing.
    root = (out / "dataset_info.json").read_bytes()
    with pytest.raises(JobError) as refused:
        rollback(str(out), 1)
    assert str(refused.value) == (
        f"cannot roll back {out} to version 1: 4 of its 4 shard files are gone "
        f"(collected by gc?), e.g. {flat[0]}; nothing was committed"
    )
    assert (out / "dataset_info.json").read_bytes() == root
    assert collect_garbage(str(out), keep=2) == []  # Nothing more to collect.
    # A window of 1: run A's folder goes (only version 2 lists it), B's stays.
    run_a = sorted(name for name in _files(out) if name.startswith(f"shards/{RUN_A}/"))
    assert len(run_a) == 9  # 4 shards, their 4 sidecars, the dead letters
    assert collect_garbage(str(out), keep=1) == run_a
    assert not (out / "shards" / RUN_A).exists()
    _assert_files_intact(out, v3)
    with pytest.raises(JobError, match="to version 2: 4 of its 4 shard files are gone"):
        rollback(str(out), 2)


def test_gc_keeps_the_files_a_rollback_lists_again(out):
    rollback(str(out), 1)  # Version 4 lists the flat files again.
    under_shards = sorted(name for name in _files(out) if name.startswith("shards/"))  # runs A, B, killed
    assert collect_garbage(str(out), keep=1) == under_shards
    assert not any((out / "shards").iterdir())
    v4 = load_version(str(out))
    _assert_files_intact(out, v4)
    assert (out / "dead_letters.jsonl").exists()
    assert _reader_keys(out, "validation") == _version_keys(out, v4, "validation")


def test_a_run_holding_the_lock_blocks_gc_and_rollback(out):
    """A process holding the folder's run lock (as a conversion does for its whole run) makes gc
    and rollback refuse with the lock's message, touching nothing; once it died, they go on."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from beam_jobs.writing.run_lock import acquire_output_lock; "
            "acquire_output_lock(sys.argv[1]); print('locked', flush=True); sys.stdin.read()",
            str(out),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = {name: (out / name).read_bytes() for name in _files(out)}
        for operation in (lambda: collect_garbage(str(out), keep=1), lambda: rollback(str(out), 1)):
            with pytest.raises(OutputLockedError) as refused:
                operation()
            assert f"another run (process {holder.pid} on" in str(refused.value)
            assert "\n" not in str(refused.value)
        proc = _cli(out, "gc", "--keep", "1", check_rc=1)
        assert proc.stderr.count("\n") == 1 and f"another run (process {holder.pid} on" in proc.stderr
        assert {name: (out / name).read_bytes() for name in _files(out)} == before
    finally:
        holder.communicate("", timeout=60)  # It exits without releasing: a killed run's lock.
    assert (out / LOCK_NAME).exists()
    assert collect_garbage(str(out), keep=2)  # A dead process's lock on this host is taken over.
    assert not (out / LOCK_NAME).exists()


def test_a_run_collecting_after_its_own_commit_never_touches_its_folder(out):
    """A conversion holds the run lock for its whole run; collecting garbage itself, it names
    its run: its folder (files no manifest lists yet) stays, and its lock stays held."""
    running = "20261204T120000Z-0a0b0c0d"
    mine = [f"shards/{running}/train-00000-of-00001.tfrecord", f"shards/{running}/.train-00000-of-00001.tfrecord.json"]
    lock = acquire_output_lock(str(out))
    try:
        for name in mine:
            local_put(out)(name, b"being written by the run holding the lock")
        with pytest.raises(OutputLockedError):
            collect_garbage(str(out), keep=1)
        deleted = collect_garbage(str(out), keep=1, holding_run=running)
        run_a = [name for name in deleted if name.startswith(f"shards/{RUN_A}/")]
        assert len(run_a) == 9 and set(KILLED_LEFTOVERS) <= set(deleted)
        assert not [name for name in deleted if name.startswith(f"shards/{running}/")]
        assert all((out / name).exists() for name in mine)
        assert (out / LOCK_NAME).exists()
    finally:
        release_output_lock(lock)


def test_cli_list_files_gc_and_rollback(out):
    lines = _cli(out, "list").stdout.splitlines()
    assert lines[0].split() == ["version", "committed_at", "change", "examples", "files"]
    v3, v2 = load_version(str(out)), load_version(str(out), 2)
    rows = [line.split(None, 1) for line in lines[1:]]
    assert [row[0] for row in rows] == ["*", "2", "1"] and lines[1].split()[1] == "3"
    examples = ", ".join(f"{split} {facts['num_examples']}" for split, facts in v3["splits"].items())
    assert f"{v3['committed_at']}  overwrite" in lines[1] and examples in lines[1] and lines[1].endswith("kept")
    assert lines[3].split()[1:3] == ["-", "-"] and lines[3].endswith("kept")  # version 1: an older release
    files = _cli(out, "files").stdout.splitlines()
    assert files == [str(out / name) for name in shard_files(v3)]
    assert _cli(out, "files", "--version", "2", "--split", "validation").stdout.splitlines() == [
        str(out / name) for name in shard_files(v2, "validation")
    ]
    gc = _cli(out, "gc", "--keep", "2").stdout.splitlines()
    assert gc[:-1] == sorted(shard_files(load_version(str(out), 1)) + ["dead_letters.jsonl"] + KILLED_LEFTOVERS)
    assert gc[-1] == "deleted 7 files; the files of versions 3, 2 are kept"
    assert _cli(out, "list").stdout.splitlines()[3].endswith("collected")
    assert _cli(out, "rollback", "2").stdout == "version 4 committed: the content of version 2\n"
    assert _cli(out, "--help").stdout.count("rollback") >= 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["rollback", "0"], "argument N: expected a whole number of at least 1 (got '0')"),
        (["rollback", "two"], "argument N: expected a whole number of at least 1 (got 'two')"),
        (["rollback", "9"], "version 9 is not kept in {out}; kept versions: 3, 2, 1"),
        (["rollback", "3"], "version 3 is already the current version of {out}"),
        (["files", "--split", "test"], "version 3 has no split 'test'; it has train, validation"),
        (["files", "--version", "7"], "version 7 is not kept"),
        (["gc", "--keep", "0"], "argument --keep: expected a whole number of at least 1 (got '0')"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(out, args, message):
    before = (out / "dataset_info.json").read_bytes()
    proc = _cli(out, *args, check_rc=2)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert message.format(out=out) in proc.stderr
    assert (out / "dataset_info.json").read_bytes() == before


def test_cli_on_a_folder_without_a_dataset_is_one_line_and_exit_2(tmp_path):
    proc = _cli(tmp_path, "list", check_rc=2)
    assert (
        proc.stderr == f"python -m beam_jobs.versions: error: {tmp_path} holds no dataset_info.json: "
        "no version was committed there\n"
    )

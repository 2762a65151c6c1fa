"""Local-disk commits (beam_jobs/writing/commit.py): versions numbered from the parent, a stale commit
refused in one line, exactly one winner among racing committer processes, and a committer
SIGKILLed at random instants leaving the old version or the new one, whole, with its history."""

from __future__ import annotations

import hashlib
import json
import re
import signal

import pytest

from beam_jobs.errors import JobError
from beam_jobs.versions import history
from beam_jobs.writing import commit as commit_module
from beam_jobs.writing.commit import (
    COMMIT_LOCK_NAME,
    CommitConflictError,
    Current,
    commit_version,
    manifest_bytes,
    read_current,
    version_file,
)
from tests.versions.committers import assert_consistent, content, kill_committers, race

CREATE = {"kind": "create", "run": "20261201T133000Z-3fa2c1d0"}


def _commit(out, version_content: dict, kind: str = "overwrite") -> dict:
    return commit_version(
        str(out), version_content, expected=read_current(str(out)), change={"kind": kind, "run": None}
    )


def test_first_commit_is_version_1_and_is_copied_into_history(tmp_path):
    out = tmp_path / "out"
    assert read_current(str(out)).manifest is None and read_current(str(out)).version is None
    committed = commit_version(str(out), content(1), expected=read_current(str(out)), change=CREATE)
    assert committed["version"] == 1 and committed["parent_version"] is None
    assert committed["change"] == CREATE
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", committed["committed_at"])
    root = (out / "dataset_info.json").read_bytes()
    assert json.loads(root) == committed and root == manifest_bytes(committed)
    assert (out / version_file(1)).read_bytes() == root
    current = read_current(str(out))
    assert current.version == 1 and current.data == root and current.token == hashlib.sha256(root).hexdigest()


def test_each_commit_is_its_parent_plus_one(tmp_path):
    out = tmp_path / "out"
    for version in range(1, 5):
        assert _commit(out, content(version))["version"] == version
    assert [m["version"] for m in history(str(out))] == [4, 3, 2, 1]
    assert [m["parent_version"] for m in history(str(out))] == [3, 2, 1, None]
    assert assert_consistent(str(out)) == 4


def test_a_stale_commit_is_refused_in_one_line_naming_the_version_now_current(tmp_path):
    out = tmp_path / "out"
    _commit(out, content(1))
    stale = read_current(str(out))
    _commit(out, content(2))
    before = (out / "dataset_info.json").read_bytes()
    with pytest.raises(CommitConflictError) as refused:
        commit_version(str(out), content(2, author="late"), expected=stale, change={"kind": "overwrite", "run": None})
    message = str(refused.value)
    # The late commit would have been numbered above every history file (version 3), over the version it read.
    assert "\n" not in message and "version 2 is current now" in message and "version 3 (over version 1)" in message
    assert (out / "dataset_info.json").read_bytes() == before
    assert not (out / version_file(3)).exists()
    # Over a folder that gained a dataset since it was read empty, too.
    with pytest.raises(CommitConflictError, match="version 2 is current now"):
        commit_version(str(out), content(1), expected=read_current(str(tmp_path / "elsewhere")), change=CREATE)


def test_a_dataset_of_an_older_release_is_version_1_and_kept_as_such(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    legacy = manifest_bytes({"schema_version": 1, "label_names": ["a"], "splits": {}})
    (out / "dataset_info.json").write_bytes(legacy)
    assert read_current(str(out)).version == 1
    committed = _commit(out, content(2))
    assert (committed["version"], committed["parent_version"]) == (2, 1)
    assert (out / version_file(1)).read_bytes() == legacy
    assert [m["version"] for m in history(str(out))] == [2, 1]


def test_a_missing_history_copy_is_repaired_by_the_next_commit(tmp_path):
    out = tmp_path / "out"
    _commit(out, content(1))
    _commit(out, content(2))
    root = (out / "dataset_info.json").read_bytes()
    (out / version_file(2)).unlink()  # As a committer killed right after its root write leaves it.
    assert [m["version"] for m in history(str(out))] == [2, 1]
    _commit(out, content(3))
    assert (out / version_file(2)).read_bytes() == root
    assert assert_consistent(str(out)) == 3


def test_a_removed_root_never_reuses_a_version_number_history_holds(tmp_path):
    out = tmp_path / "out"
    _commit(out, content(1))
    _commit(out, content(2))
    (out / "dataset_info.json").unlink()
    committed = _commit(out, content(3), kind="create")
    assert (committed["version"], committed["parent_version"]) == (3, None)
    assert json.loads((out / version_file(2)).read_bytes())["version"] == 2


@pytest.mark.parametrize("out", ["hdfs://namenode/data/out", "azfs://account/container/out"])
def test_a_filesystem_without_conditional_writes_is_refused_naming_its_scheme(out):
    scheme = out.split("://")[0]
    with pytest.raises(JobError, match=f"{scheme}:// offers no conditional write") as refused:
        read_current(out)
    assert "\n" not in str(refused.value)
    with pytest.raises(JobError, match=f"{scheme}://.*nothing was committed"):
        commit_version(out, content(1), expected=Current(manifest=None, data=None, token=None), change=CREATE)


def test_racing_committer_processes_exactly_one_wins_each_round(tmp_path):
    out = tmp_path / "out"
    rounds = race(str(out), 4, 5)
    for round_number, outcomes in rounds.items():
        won = [name for name, outcome, _ in outcomes if outcome == "won"]
        assert len(won) == 1, outcomes
        losers = [message for _, outcome, message in outcomes if outcome != "won"]
        assert all(
            message.startswith(str(out)) and "\n" not in message and f"version {round_number} is current now" in message
            for message in losers
        ), outcomes
        manifest = json.loads((out / version_file(round_number)).read_bytes())
        assert manifest["author"] == manifest["change"]["run"] == won[0]
    assert [m["version"] for m in history(str(out))] == [5, 4, 3, 2, 1]
    assert (out / COMMIT_LOCK_NAME).exists()


def test_a_committer_sigkilled_at_random_instants_leaves_one_whole_version(tmp_path):
    out = tmp_path / "out"
    # 2 MB manifests: the root write takes long enough for kills to land inside it too.
    padding = 2 << 20
    states = kill_committers(str(out), 36, padding=padding, seed=20261201)
    print(
        f"states after 36 kills ({read_current(str(out)).version} versions): {states}"
    )  # Where the kills landed (shown with -s; not a verdict).
    # The next commit repairs whatever the last kill left: the history copy, the temp file.
    version = read_current(str(out)).version
    commit_version(
        str(out),
        content(version + 1, padding=padding),
        expected=read_current(str(out)),
        change={"kind": "overwrite", "run": None},
    )
    assert assert_consistent(str(out), padding=padding) == version + 1
    assert (out / version_file(version + 1)).exists()
    leftovers = [p.name for p in out.rglob(".tmp-*")]
    assert not leftovers, f"temp files left after a commit: {leftovers}"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_inside_a_commit_lands_after_it_and_the_commit_is_whole(tmp_path, monkeypatch, signum):
    # The interrupt arrives as the root is written: the history copy must still be written, no
    # temp file left, and only then the interrupt raised.
    out = tmp_path / "out"
    _commit(out, content(1))
    write = commit_module._LocalStore.write  # pylint: disable=protected-access
    sent = []

    def write_then_signal(self, path, data):
        if path.endswith("dataset_info.json") and not sent:
            sent.append(signum)
            signal.raise_signal(signum)
        write(self, path, data)

    monkeypatch.setattr(commit_module._LocalStore, "write", write_then_signal)  # pylint: disable=protected-access
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with pytest.raises(KeyboardInterrupt):
            _commit(out, content(2))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sent == [signum]
    assert read_current(str(out)).version == 2
    assert (out / version_file(2)).read_bytes() == (out / "dataset_info.json").read_bytes()
    assert not [p.name for p in out.rglob(".tmp-*")]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are put back

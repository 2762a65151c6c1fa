"""SIGKILL at any instant of a run's last step (dead letters, the commit, the clean-up and the
garbage collection after it) leaves one whole version current: the old one or the new one.

The states are built by the real job (see states.build_three_states).
"""

from __future__ import annotations

import json
import random
import shutil
import time

import pytest

from beam_jobs.writing.run_folders import run_of
from tests.lifecycle.checks import examples_of_manifest, manifest, open_examples, read_through, verify_clean
from tests.lifecycle.states import build_three_states, start_finalize_child

KILLS = 20  # and 10 more on MinIO (tests/objectstores/test_lifecycle_stores.py)


@pytest.fixture(scope="module")
def three_states(tmp_path_factory):
    return build_three_states(tmp_path_factory.mktemp("kills"))


def _restore(template, out) -> None:
    """The folder as the template has it, at the same path (readers opened on it stay valid: the
    files they list come back byte for byte)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(template, out)


def _listing(info: dict) -> dict:
    """What a reader built from a manifest reads: its splits' shard files and counts."""
    return {
        split: [(s["file"], s["num_examples"], s["sha256"]) for s in facts["shards"]]
        for split, facts in info["splits"].items()
    }


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_kill_at_any_instant_of_the_commit_leaves_one_whole_version(three_states, tmp_path):
    template, args, old, new = three_states
    out = tmp_path / "out"
    _restore(template, out)
    # A trainer that opened version 2 before the run's last step: built once, read after each kill.
    before = open_examples(out)
    # How long the whole step takes here, unkilled: the kills are spread over that window.
    child = start_finalize_child(args, str(out), tmp_path)
    began = time.monotonic()
    child.stdin.write("go\n")
    child.stdin.flush()
    # When the root changes (the commit), watched from here: the clean-up and gc after it take
    # most of the step, so half the kills are spread over twice the time to the commit, and
    # half over the whole step, and both outcomes are certain to occur, whatever the machine.
    committed_after = None
    while committed_after is None and child.poll() is None:
        try:
            if json.loads((out / "dataset_info.json").read_text())["version"] == 3:
                committed_after = time.monotonic() - began
        except (OSError, ValueError):  # between the temp file and its rename: read again
            pass
    assert child.stdout.readline().strip() == "done"
    window = (time.monotonic() - began) * 1.2
    committed_after = committed_after if committed_after is not None else window / 2
    assert child.wait(timeout=60) == 0
    assert manifest(out)["version"] == 3 and examples_of_manifest(out, manifest(out)) == new
    # Readers opened after the commit (version 3) and before it (version 2); each kill's outcome
    # must be one of the two, so these readers stand for one opened after that kill.
    opened_after = {3: (_listing(manifest(out)), open_examples(out))}
    _restore(template, out)
    opened_after[2] = (_listing(manifest(out)), open_examples(out))
    assert read_through(before) == old
    rng = random.Random(20)
    outcomes = {2: 0, 3: 0}
    # The early half's window follows the machine: halved after an early kill that came too late
    # (the commit was done), widened a little after one before it. A single timing of the step,
    # taken while other tests loaded the cores, once put all 20 kills after the commit.
    early = 2 * committed_after
    for kill in range(KILLS):
        _restore(template, out)
        child = start_finalize_child(args, str(out), tmp_path)
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(rng.uniform(0, early if kill % 2 == 0 else window))
        child.kill()
        child.wait()
        info = manifest(out)
        assert info["version"] in (2, 3), info["version"]
        outcomes[info["version"]] += 1
        if kill % 2 == 0:
            early = early / 2 if info["version"] == 3 else min(window, early * 1.25)
        verify_clean(out)
        # Read after the kill: exactly the version the root names, every example once.
        assert examples_of_manifest(out, info) == (old if info["version"] == 2 else new)
        listing, reader = opened_after[info["version"]]
        assert _listing(info) == listing
        assert read_through(reader) == (old if info["version"] == 2 else new)
        # Opened before: version 2, whole, whichever version is current now (it is kept).
        assert read_through(before) == old
        # Nothing the current version lists is gone, and only run folders of ours are there.
        listed = {shard["file"] for split in info["splits"].values() for shard in split["shards"]}
        assert all((out / name).is_file() for name in listed)
        assert {run_of(name) for name in listed} <= {p.name for p in (out / "shards").iterdir()}
    # The kills really fell on both sides of the commit.
    assert outcomes[2] and outcomes[3], outcomes

"""Two runs into one folder at once: exactly one commits, the other fails with one clear line, and
the folder holds one whole version of the winner's examples."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO
from tests.lifecycle.checks import examples_of_manifest, examples_read, manifest, verify_clean


@pytest.mark.slow
@pytest.mark.parametrize("first_commit", [False, True], ids=["new folder", "over a version"])
def test_two_runs_at_once_one_wins_one_fails_in_one_line(tmp_path, first_commit):
    src = tmp_path / "src"
    make_photo_tree(src, num_images=20, seed=4)
    out = tmp_path / "out"
    flags = ["--input", str(src), "--output_dir", str(out), "--image_size", "24x24", "--direct_num_workers", "1"]
    if first_commit:
        subprocess.run(
            [sys.executable, "-m", "beam_jobs", *flags], cwd=REPO, check=True, capture_output=True, timeout=600
        )
    extra = ["--overwrite"] if first_commit else []
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "beam_jobs", *flags, *extra, "--num_shards", str(n)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (2, 3)
    ]
    outcomes = [(run.wait(timeout=600), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in outcomes)
    assert codes[0] == 0 and codes[1] != 0, outcomes
    [(code, stderr)] = [outcome for outcome in outcomes if outcome[0] != 0]
    errors = [line for line in stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]
    # A loaded machine can start the second run's pre-flight after the first has committed: it is then
    # refused as any later run into that folder is, still in one line and with nothing mixed.
    reasons = ("another run", "changed after this commit read it", "already holds a dataset (version 1")
    assert len(errors) == 1 and any(reason in errors[0] for reason in reasons), stderr
    winner = 2 if outcomes[0][0] == 0 else 3
    info = manifest(out)
    assert info["version"] == (2 if first_commit else 1)
    assert info["splits"]["train"]["num_shards"] == winner
    verify_clean(out)
    assert examples_read(out) == examples_of_manifest(out, info)
    assert sum(examples_read(out).values()) == 20


def test_a_write_probe_removed_by_the_run_holding_the_folder_is_no_error(tmp_path, monkeypatch):
    """A run checks that it can write before it waits for the folder's lock; the run holding the
    lock removes any .tmp-...-probe it finds as a killed run's leftover, the waiting run's own
    included. Its probe then fails to delete because it is gone, which is no permission problem:
    the run goes on (and is refused on the lock with its one line), no "cannot write" error."""
    from beam_jobs import preflight  # pylint: disable=import-outside-toplevel

    real_delete = preflight.delete_exactly

    def removed_by_the_other_run_first(paths: list[str]) -> None:
        for path in paths:
            os.remove(path)  # the lock holder's leftover clean-up, between the write and the delete
        real_delete(paths)  # raises: the file is not there

    monkeypatch.setattr(preflight, "delete_exactly", removed_by_the_other_run_first)
    preflight._probe_writable(str(tmp_path))  # pylint: disable=protected-access
    assert os.listdir(tmp_path) == []

"""A plain rerun after an interrupted run says that --resume would have kept its shards."""

from __future__ import annotations

import shutil

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli

_HINT = "an interrupted earlier run"


def test_a_plain_rerun_names_the_shards_of_an_interrupted_run_that_resume_would_keep(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=8, size=(120, 90), seed=3)
    out = tmp_path / "out"
    flags = ["--input", photos, "--output_dir", out, "--image_size", "32", "--num_shards", "2"]
    first = run_cli(*flags)
    assert _HINT not in first.stderr
    # A run killed just before its commit: complete shards in its run folder, no version lists it.
    (out / "dataset_info.json").unlink()
    shutil.rmtree(out / "versions")
    rerun = run_cli(*flags)
    assert _HINT in rerun.stderr and "--resume" in rerun.stderr
    # Other settings: nothing --resume could keep, so nothing to say.
    (out / "dataset_info.json").unlink()
    shutil.rmtree(out / "versions")
    other = run_cli("--input", photos, "--output_dir", out, "--image_size", "48", "--num_shards", "2")
    assert _HINT not in other.stderr

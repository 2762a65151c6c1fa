"""A trainer reading while the dataset changes: an --overwrite, an --append and a rollback commit
new versions between its epochs, and it finishes every epoch on the version it opened, with
nothing missing, duplicated or mislabelled; a reader opened afterwards reads the new version."""

from __future__ import annotations

import collections
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO, run_cli
from tests.lifecycle.checks import examples_of_manifest, examples_read, manifest, verify_clean


def _train_examples(out: pathlib.Path, info: dict) -> list[list[str]]:
    return sorted(
        [name, label]
        for (split, name, label), count in examples_of_manifest(out, info).items()
        for _ in range(count)
        if split == "train"
    )


@pytest.mark.slow
def test_overwrite_append_and_rollback_under_a_running_trainer(tmp_path):
    src = tmp_path / "src"
    make_photo_tree(src, num_images=24, seed=3)
    out = tmp_path / "out"
    flags = [
        "--input",
        str(src),
        "--output_dir",
        str(out),
        "--image_size",
        "24x24",
        "--num_shards",
        "2",
        "--direct_num_workers",
        "1",
        "--keep_versions",
        "4",
    ]
    run_cli(*flags)
    version_1 = manifest(out)
    opened = _train_examples(out, version_1)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.lifecycle.trainer_child", str(tmp_path / "seen.json"), str(out), "4"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def next_epoch(change) -> None:
            line = trainer.stdout.readline().strip()
            assert line.startswith("epoch"), line
            change()
            trainer.stdin.write("next\n")
            trainer.stdin.flush()

        photos = sorted(p for p in src.rglob("*.jpg"))
        # --overwrite with fewer inputs: version 2 holds other examples than version 1.
        removed = photos[::3]
        for photo in removed:
            photo.rename(tmp_path / f"aside-{photo.parent.name}-{photo.name}")
        next_epoch(lambda: run_cli(*flags, "--overwrite"))
        # --append of new photos (a new class too): version 3 = version 2 plus them.
        extra = tmp_path / "extra"
        make_photo_tree(extra, num_images=6, seed=9)
        for photo in extra.rglob("*.jpg"):
            (src / "zebra").mkdir(exist_ok=True)
            shutil.copy2(photo, src / "zebra" / f"new-{photo.name}")
        next_epoch(lambda: run_cli(*flags, "--append"))
        # Rollback to version 1: version 4 lists version 1's files again, copying nothing.
        next_epoch(lambda: run_cli_versions(out, "rollback", "1"))
        next_epoch(lambda: None)
        assert trainer.wait(timeout=600) == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["version"] == 1
    for epoch, names in enumerate(seen["seen"]):
        assert names == opened, f"epoch {epoch} read something other than version 1"
    assert all(loss == loss for loss in seen["losses"])  # every epoch trained (no NaN, no empty epoch)
    info = manifest(out)
    assert (info["version"], info["change"]["kind"], info["change"].get("rolled_back_to")) == (4, "rollback", 1)
    verify_clean(out)
    assert examples_read(out) == examples_of_manifest(out, version_1)
    # The shards of version 1 are the very files version 4 lists: a rollback copies nothing.
    files = lambda i: sorted(s["file"] for split in i["splits"].values() for s in split["shards"])  # noqa: E731
    assert files(info) == files(version_1)
    # And the append's version: version 2's shards untouched, plus the new class at the next id.
    version_3 = json.loads((out / "versions" / "00000003.json").read_text())
    version_2 = json.loads((out / "versions" / "00000002.json").read_text())
    assert files(version_2) == [f for f in files(version_3) if f in files(version_2)]
    assert version_3["label_names"][: len(version_2["label_names"])] == version_2["label_names"]
    assert version_3["label_names"][-1] == "zebra"
    counts = collections.Counter(label for _, _, label in examples_of_manifest(out, version_3))
    assert counts["zebra"] == 6


def run_cli_versions(out: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs.versions", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result

"""Dataset states built by the real job, for the tests that kill or race a commit."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

from beam_jobs.sample_data import make_photo_tree
from beam_jobs.writing.run_folders import new_run_name
from tests.conftest import REPO, run_cli
from tests.lifecycle.checks import examples_of_manifest, manifest

__all__ = ["build_three_states", "start_finalize_child", "uncommitted_copy"]


def uncommitted_copy(out: pathlib.Path, info: dict) -> dict:
    """Copies version ``info``'s shards and sidecars into a new run folder; returns the child's
    arguments for committing that folder."""
    run = new_run_name()
    folder = out / "shards" / run
    folder.mkdir(parents=True)
    results = []
    for split, facts in info["splits"].items():
        for index, shard in enumerate(facts["shards"]):
            source = out / shard["file"]
            name = source.name
            shutil.copy2(source, folder / name)
            sidecar = source.parent / f".{name}.json"
            shutil.copy2(sidecar, folder / sidecar.name)
            labels = json.loads(sidecar.read_text())["content_keys"]
            counts = {}
            for _, _, label in labels:
                counts[label] = counts.get(label, 0) + 1
            results.append(
                {
                    "split": split,
                    "index": index,
                    "num_shards": len(facts["shards"]),
                    "file": name,
                    "num_examples": shard["num_examples"],
                    "bytes": shard["bytes"],
                    "sha256": shard["sha256"],
                    "class_counts": sorted(counts.items()),
                }
            )
    summary = {
        "label_names": info["label_names"],
        "num_inputs": info["num_inputs"],
        "warnings": [],
        "splits": {
            split: {"num_examples": f["num_examples"], "num_shards": f["num_shards"], "class_counts": f["class_counts"]}
            for split, f in info["splits"].items()
        },
    }
    preprocessing = info["preprocessing"]
    settings = {
        key: preprocessing.get(key) for key in ("splits", "split_rule", "num_shards", "target_shard_mb", "dedup")
    }
    return {
        "output_dir": str(out),
        "run": run,
        "results": results,
        "summary": summary,
        "settings": settings,
        "image": {"width": info["image"]["width"], "height": info["image"]["height"]},
    }


def build_three_states(base: pathlib.Path):
    """(template folder, the child's arguments, the examples of version 2, of the version to commit).

    Version 1, then version 2 (--overwrite with another shard count), then a third run's folder
    whose shards are complete but not committed (copies of version 1's files: another run of the
    same inputs and flags writes exactly those bytes). Committing it makes version 3 and collects
    version 1's files (outside the window of two versions kept)."""
    src = base / "src"
    make_photo_tree(src, num_images=40, seed=11)
    out = base / "template"
    flags = [
        "--input",
        str(src),
        "--output_dir",
        str(out),
        "--image_size",
        "32x32",
        "--splits",
        "train=0.8,validation=0.2",
        "--direct_num_workers",
        "1",
    ]
    run_cli(*flags, "--num_shards", "2")
    version_1 = manifest(out)
    run_cli(*flags, "--num_shards", "3", "--overwrite")
    version_2 = manifest(out)
    assert (version_1["version"], version_2["version"]) == (1, 2)
    args = uncommitted_copy(out, version_1)
    return out, args, examples_of_manifest(out, version_2), examples_of_manifest(out, version_1)


def start_finalize_child(
    args: dict, output_dir: str, tmp: pathlib.Path, beam_flags: list[str] | None = None
) -> subprocess.Popen:
    """The run's last step in a process of its own (finalize_child), ready: it starts on "go"."""
    path = tmp / "args.json"
    path.write_text(json.dumps({**args, "output_dir": output_dir, "beam_flags": beam_flags or []}))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.lifecycle.finalize_child", str(path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    return child

"""The conversion pipeline's shape: its transforms and the stages the local runner fuses them into.

    python benchmarks/pipeline_shape.py                 # this checkout
    python benchmarks/pipeline_shape.py --ref 27d40fb   # and an older commit, side by side
    python benchmarks/pipeline_shape.py --ref 6e47793 --time 5   # and each one's whole run, timed

With ``--time N``, each checkout also converts the same 4 photos N times as a user runs it (a fresh
process, the local runner with its defaults), interleaved, and the median wall time is printed: on
so small a job that time is the fixed start-up, which the stage count is part of.

Each checkout's job is built by its own ``beam_jobs.pipeline.run`` on a small photo tree, with a
runner that runs nothing and keeps the pipeline (so the count is what a real run would submit);
the stages are those the FnApiRunner's own fusion makes of it (``FnApiRunner.create_stages``).
Flink fuses by its own rules, so its count differs, but it runs one SDK worker call per fused
stage too: fewer stages are less start-up on every runner.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

_MEASURE = r"""
import json, os, pathlib, sys, tempfile
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from apache_beam.runners.portability.fn_api_runner import fn_runner

class ShapeRunner(PipelineRunner):
    def run_pipeline(self, pipeline, options):
        proto = pipeline.to_runner_api()
        transforms = proto.components.transforms
        leaves = [t for t in transforms.values() if not t.subtransforms]
        _, stages = fn_runner.FnApiRunner().create_stages(proto)
        print(json.dumps({"transforms": len(transforms), "leaf_transforms": len(leaves), "fused_stages": len(stages)}))
        return PipelineResult(PipelineState.DONE)

sys.modules["shape_runner"] = sys.modules[__name__]
from beam_jobs.pipeline import run
photos, out = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
try:
    run(["--runner=shape_runner.ShapeRunner", "--input", photos, "--output_dir", out, *extra])
except (FileNotFoundError, OSError):
    pass  # nothing ran, so there is no dataset_info.json to read back
"""


def _photo_tree(root: pathlib.Path) -> pathlib.Path:
    """Two classes of real photos (scikit-image's), enough for the job to plan a run."""
    import skimage  # pylint: disable=import-outside-toplevel

    data = pathlib.Path(skimage.__file__).parent / "data"
    for label, names in {"a": ("astronaut.png", "chelsea.png"), "b": ("coffee.png", "rocket.jpg")}.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / label / name).write_bytes((data / name).read_bytes())
    return root


def _measure(code_root: pathlib.Path, photos: pathlib.Path, out: pathlib.Path, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(photos), str(out), *extra],
        cwd=code_root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _timed_run(code_root: pathlib.Path, photos: pathlib.Path, out: pathlib.Path) -> float:
    """Seconds for one whole conversion, as a process, from the command to its exit."""
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), "--image_size", "32"],
        cwd=code_root,
        env=env,
        capture_output=True,
        check=True,
        timeout=600,
    )
    return time.perf_counter() - began


def _time_checkouts(checkouts: list, photos: pathlib.Path, scratch: pathlib.Path, repeats: int) -> None:
    times: dict[str, list[float]] = {name: [] for name, _ in checkouts}
    for repeat in range(repeats):
        order = checkouts if repeat % 2 == 0 else checkouts[::-1]  # neither always runs first
        for name, root in order:
            out = scratch / f"timed-{name.replace(' ', '_')}-{repeat}"
            times[name].append(_timed_run(root, photos, out))
    print()
    print(f"| checkout | whole run of 4 photos, median of {repeats} (s) | ratio to the first |")
    print("|---|---|---|")
    first = statistics.median(times[checkouts[0][0]])
    for name, _ in checkouts:
        median = statistics.median(times[name])
        print(f"| {name} | {median:.2f} | {median / first:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="an older commit to measure beside this checkout")
    parser.add_argument("--time", type=int, default=0, metavar="N", help="also time N whole runs of each checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = pathlib.Path(scratch)
        photos = _photo_tree(scratch_path / "photos")
        checkouts = [("this checkout", REPO)]
        if args.ref:
            old = scratch_path / "ref"
            old.mkdir()
            archive = subprocess.run(
                ["git", "archive", args.ref, "beam_jobs", "tfdata_readers"], cwd=REPO, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            checkouts.insert(0, (args.ref, old))
        runs = {
            "a first version": [],
            "--dedup content, two splits": ["--dedup", "content", "--splits", "train=0.5,validation=0.5"],
        }
        print("| checkout | run | transforms (all) | leaf transforms | fused stages (local runner) |")
        print("|---|---|---|---|---|")
        for name, root in checkouts:
            for index, (run, flags) in enumerate(runs.items()):
                shape = _measure(root, photos, scratch_path / f"out-{name.replace(' ', '_')}-{index}", flags)
                print(
                    f"| {name} | {run} | {shape['transforms']} | {shape['leaf_transforms']} | {shape['fused_stages']} |"
                )
        if args.time:
            _time_checkouts(checkouts, photos, scratch_path, args.time)


if __name__ == "__main__":
    main()

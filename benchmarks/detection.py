"""Detection benchmark: a COCO set converted with `--resize_mode keep`, against Model Garden's converter.

The inputs: N real photos (500x375, the sample tree's), each with two crops of real photos pasted
on it, and a COCO annotation file giving their boxes (`python -m beam_jobs.sample_data --coco`).
Both converters write every image at its own size with its boxes, and are timed as whole
processes (imports and start-up included), interleaved over the repeats, on the same cores:

- this job: `--input ROOT --coco_annotations FILE --resize_mode keep` on the local runner (every core);
- TensorFlow Model Garden's `official/vision/data/create_coco_tf_record.py` (tf-models-official
  2.20, from tests/modelgarden-requirements.txt), with `--num_processes` = the cores.

Model Garden's script stores each JPEG's bytes as they are and has no EXIF, bad-input or resume
handling; the job decodes every image (to refuse broken ones) and turns those that need it. Both
write 8 shards. The table gives medians in images/s and the ratio.

    python benchmarks/detection.py                      # 2000 images, 3 repeats
    python benchmarks/detection.py --num_images 400 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.sample_data import make_photo_tree, paste_objects  # noqa: E402

SHARDS = 8
# Runs Model Garden's converter with the three package __init__s that import every Vision task
# (and tensorflow-datasets with them) given as empty packages: only the converter's own modules load.
_GARDEN_RUNNER = """
import os, runpy, sys, types
garden = sys.argv[1]
sys.path.insert(0, garden)
for name in ("official.vision", "official.vision.configs", "official.core"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(garden, *name.split("."))]
    sys.modules[name] = package
sys.argv = ["create_coco_tf_record", *sys.argv[2:]]
runpy.run_path(os.path.join(garden, "official/vision/data/create_coco_tf_record.py"), run_name="__main__")
"""


def make_detection_set(root: pathlib.Path, num_images: int) -> pathlib.Path:
    """Photos with two pasted real-photo crops each, and their COCO file (boxes in pixels)."""
    photos = root / "photos"
    annotations = root / "instances.json"
    paste_objects(photos, make_photo_tree(photos, num_images=num_images, seed=3), annotations, seed=3)
    return annotations


def _timed(command: list[str]) -> float:
    began = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-3000:]}")
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work_dir", default=None, help="where the photos and datasets go (default: a temp dir)")
    args = parser.parse_args(argv)
    garden = pathlib.Path(sys.prefix) / "modelgarden"
    if not (garden / "official").is_dir():
        raise SystemExit(f"no Model Garden in {garden}: run launch/ensure_venv.sh test first")
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="detection-bench-"))
    annotations = work / "instances.json"
    if not annotations.exists():
        make_detection_set(work, args.num_images)
    count = len(json.loads(annotations.read_text())["images"])
    cores = os.cpu_count() or 1
    times: dict[str, list[float]] = {"job": [], "garden": []}
    for repeat in range(args.repeats):
        out = work / "runs" / str(repeat)
        shutil.rmtree(out, ignore_errors=True)
        times["job"].append(
            _timed(
                [
                    sys.executable,
                    "-m",
                    "beam_jobs",
                    "--input",
                    str(work / "photos"),
                    "--coco_annotations",
                    str(annotations),
                    "--resize_mode",
                    "keep",
                    "--num_shards",
                    str(SHARDS),
                    "--output_dir",
                    str(out / "job"),
                ]
            )
        )
        times["garden"].append(
            _timed(
                [
                    sys.executable,
                    "-c",
                    _GARDEN_RUNNER,
                    str(garden),
                    f"--image_dir={work / 'photos'}",
                    f"--object_annotations_file={annotations}",
                    f"--output_file_prefix={out / 'garden' / 'train'}",
                    f"--num_shards={SHARDS}",
                    f"--num_processes={cores}",
                ]
            )
        )
    job, garden_s = statistics.median(times["job"]), statistics.median(times["garden"])
    print(f"{count} images with 2 boxes each, --resize_mode keep, {cores} cores, {args.repeats} repeat(s), medians")
    print(f"{'converter':<34} {'seconds':>8} {'images/s':>9}")
    print(f"{'this job (local runner)':<34} {job:>8.1f} {count / job:>9.0f}")
    print(f"{'Model Garden create_coco_tf_record':<34} {garden_s:>8.1f} {count / garden_s:>9.0f}")
    print(f"ratio job / Model Garden (images/s): {garden_s / job:.2f}x")
    print("per repeat, job: " + ", ".join(f"{t:.1f}" for t in times["job"]))
    print("per repeat, Model Garden: " + ", ".join(f"{t:.1f}" for t in times["garden"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

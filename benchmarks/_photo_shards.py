"""The reader benchmarks' dataset: N real photos (500x375, the sample tree's) as 224x224 JPEG shards.

Made once per work folder and kept, so repeated runs measure reading, not converting.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

__all__ = ["photo_shards"]


def photo_shards(work: pathlib.Path, num_images: int, num_shards: int) -> pathlib.Path:
    """The data dir of `num_images` photos in `num_shards` shards of one train split, under `work`."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    data = work / f"shards_{num_images}"
    if not (data / "dataset_info.json").exists():
        make_photo_tree(work / "photos", num_images=num_images, size=(500, 375), seed=0)
        subprocess.run(
            [sys.executable, "-m", "beam_jobs", "--input", str(work / "photos"), "--output_dir", str(data),
             "--image_size", "224", "--num_shards", str(num_shards), "--splits", "train=1.0"],
            check=True, cwd=REPO,
        )  # fmt: skip
    return data

"""Append benchmark: a 10% --append against a full run over the same, grown, tree.

A dataset of N real photos is converted once; N/10 new photos are then added to the tree, and two
things are timed as whole processes (imports and start-up included), interleaved over the repeats
on copies of the same starting folder:

- the full run: `--overwrite`, converting all N + N/10 inputs again;
- the append: `--append`, converting only the N/10 new inputs (the current version's inputs are
  read from its shards' sidecars) and committing a version that lists the old shards untouched.

The table gives medians, the ratio append / full run (the target is at most 0.20), and checks
that the append left every old shard's bytes unchanged.

    python benchmarks/append.py                       # 4000 photos of 500x375, 3 repeats
    python benchmarks/append.py --num_images 1000 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from beam_jobs.sample_data import make_photo_tree  # noqa: E402

TARGET = 0.20


def _job(*args: str) -> float:
    began = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"the job failed ({result.returncode}): {' '.join(args)}\n{result.stderr[-3000:]}")
    return time.perf_counter() - began


def _shard_digests(out: pathlib.Path, info: dict) -> dict[str, str]:
    return {
        shard["file"]: hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
        for split in info["splits"].values()
        for shard in split["shards"]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_images", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image_size", default="224")
    parser.add_argument("--work_dir", default=None, help="where the photos and datasets go (default: a temp dir)")
    args = parser.parse_args(argv)
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="append-bench-"))
    src, extra, start = work / "src", work / "extra", work / "start"
    shutil.rmtree(work / "runs", ignore_errors=True)
    if not src.exists():
        make_photo_tree(src, num_images=args.num_images, seed=1)
    # The starting dataset is made before the new photos are added (a reused --work_dir keeps both).
    for added in sorted(src.rglob("added-*")) if not start.exists() else []:
        added.unlink()
    flags = ["--input", str(src), "--image_size", args.image_size, "--splits", "train=0.9,validation=0.1"]
    if not start.exists():
        _job(*flags, "--output_dir", str(start))
    before = json.loads((start / "dataset_info.json").read_text())
    old_digests = _shard_digests(start, before)
    # The 10% more: new photos (other seeds, so other crops), in the same class folders.
    if not extra.exists():
        make_photo_tree(extra, num_images=max(1, args.num_images // 10), seed=2)
        for photo in sorted(extra.rglob("*.jpg")):
            shutil.copy2(photo, src / photo.parent.name / f"added-{photo.name}")
    full, append = [], []
    for repeat in range(args.repeats):
        for kind, times in (("append", append), ("full", full)):
            out = work / "runs" / f"{kind}-{repeat}"
            shutil.copytree(start, out)
            times.append(_job(*flags, "--output_dir", str(out), "--append" if kind == "append" else "--overwrite"))
            if kind == "append":
                info = json.loads((out / "dataset_info.json").read_text())
                assert info["change"]["kind"] == "append", info["change"]
                unchanged = {name: digest for name, digest in _shard_digests(out, info).items() if name in old_digests}
                assert unchanged == old_digests, "an append changed the bytes of an old shard"
                added = sum(info["change"]["added"].values())
                assert added == max(1, args.num_images // 10), (added, info["change"])
            shutil.rmtree(out)
    full_s, append_s = statistics.median(full), statistics.median(append)
    ratio = append_s / full_s
    total = args.num_images + max(1, args.num_images // 10)
    print(
        f"Append benchmark: {args.num_images} photos + {max(1, args.num_images // 10)} new, "
        f"--image_size {args.image_size}, median of {args.repeats}"
    )
    print(f"{'run':<34}{'seconds':>10}{'ratio':>10}")
    print(f"{'full run (--overwrite, ' + str(total) + ' inputs)':<34}{full_s:>10.1f}{1.0:>10.2f}")
    print(f"{'append (--append, new inputs)':<34}{append_s:>10.1f}{ratio:>10.2f}")
    print(
        f"target: append <= {TARGET:.2f} x full run: {'met' if ratio <= TARGET else 'MISSED'}; "
        f"old shards' bytes unchanged: yes ({len(old_digests)} shards checked)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

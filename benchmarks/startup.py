"""Where the job's fixed start-up goes: a conversion of 6 photos, profiled, split into its phases.

The job runs in this process under cProfile (its SDK workers are separate processes, as always);
the phases are the cumulative times of the functions that make them up. A worker's own start-up
(Python, Beam and the job's modules imported by a fresh process) is timed separately, and the
whole run is also timed as a process from outside, as a user sees it.

    python benchmarks/startup.py              # 5 repeats, medians
"""

from __future__ import annotations

import argparse
import cProfile
import pathlib
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (phase, a function whose cumulative time is the phase): in the order they run.
PHASES = [
    ("parse and check the flags", "arguments.py", "parse_job_arguments"),
    ("build the pipeline (the job's transforms, Beam's type checks)", "convert_images.py", "expand"),
    ("run it: workers start, bundles run, data plane", "fn_runner.py", "run_pipeline"),
    ("finalize: dead letters, manifest, commit, gc", "finalize.py", "finalize_outputs"),
]


def _profiled_run(photos: pathlib.Path, out: pathlib.Path) -> tuple[float, dict[str, float]]:
    from beam_jobs import pipeline  # pylint: disable=import-outside-toplevel

    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.runcall(pipeline.run, ["--input", str(photos), "--output_dir", str(out)])
    total = time.perf_counter() - began
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    phases = {}
    for phase, file_name, function in PHASES:
        phases[phase] = max(
            (
                ct
                for (path, _, name), (_, _, _, ct, _) in stats.items()
                if name == function and path.endswith(file_name)
            ),
            default=0.0,
        )
    return total, phases


def _seconds(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    work = pathlib.Path(tempfile.mkdtemp(prefix="startup-bench-"))
    photos = work / "photos"
    make_photo_tree(photos, num_images=6, size=(500, 375), seed=0)
    imports = [_seconds([sys.executable, "-c", "import beam_jobs.pipeline"]) for _ in range(args.repeats)]
    workers = [
        _seconds(
            [
                sys.executable,
                "-c",
                "import apache_beam.runners.worker.sdk_worker_main, beam_jobs.writing.convert_shards, "
                "beam_jobs.planning.transforms, beam_jobs.listing.discover",
            ]
        )
        for _ in range(args.repeats)
    ]
    wholes = []
    for repeat in range(args.repeats):
        out = work / f"whole-{repeat}"
        wholes.append(_seconds([sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out)]))
    runs = []
    for repeat in range(args.repeats):
        runs.append(_profiled_run(photos, work / f"profiled-{repeat}"))
    shutil.rmtree(work)
    print(f"| 6 photos, median of {args.repeats} | seconds |")
    print("|---|---:|")
    print(f"| the whole run, as a process (`python -m beam_jobs`) | {statistics.median(wholes):.2f} |")
    print(
        f"| of which: a fresh interpreter importing the job (beam_jobs.pipeline, Beam) | "
        f"{statistics.median(imports):.2f} |"
    )
    for phase, _, _ in PHASES:
        print(f"| of which: {phase} (profiled) | {statistics.median(r[1][phase] for r in runs):.2f} |")
    print(f"| the profiled run in all (its overhead included) | {statistics.median(r[0] for r in runs):.2f} |")
    print(
        f"| one SDK worker's own start: Python, Beam's worker and the job's modules | "
        f"{statistics.median(workers):.2f} |"
    )


if __name__ == "__main__":
    main()

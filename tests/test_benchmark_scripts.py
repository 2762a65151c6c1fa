"""The benchmark scripts that judge a design choice run, and say what they measured."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def _benchmark_output(script: str, *args: str, timeout: float = 600) -> str:
    """What ``benchmarks/<script>`` prints, run as a user runs it; a failed run fails the test."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return done.stdout


def test_the_resampling_benchmark_times_scores_and_tests_aliasing_of_every_candidate():
    stdout = _benchmark_output("resampling.py", "--num_images", "4", "--repeats", "1", timeout=300)
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    for candidate in ("pillow bicubic (the job's default)", "script bilinear", "dct >= 1.1x + pillow bicubic"):
        (row,) = [row for row in rows if row.startswith(f"| {candidate}")]
        ms, speed, psnr = (cell.strip() for cell in row.split("|")[2:5])
        assert float(ms) > 0 and speed.endswith("x") and 25 < float(psnr) < 60, row
    for resampler in ("pillow bicubic", "pillow bilinear", "linear (prefilter from 1.5x)"):
        patterns = [row for row in rows if row.startswith(f"| {resampler} |")]
        assert len(patterns) == 4, stdout
    # At 8x every pattern is flat through Pillow's bicubic: the measure can tell flat from not.
    bicubic = [row.split("|") for row in rows if row.startswith("| pillow bicubic |")]
    assert all(float(cells[-2]) < 5 for cells in bicubic)
    assert any(float(cells[3]) > 20 for cells in bicubic)  # at 1.2x, the stripes come through


def test_the_pipeline_keeps_the_stage_counts_the_docs_state():
    """README and docs/benchmarks.md state 18 fused stages for a first version (29 with --dedup
    content and two splits): a change that adds stages back fails here, where it is cheap to see."""
    stdout = _benchmark_output("pipeline_shape.py", timeout=600)
    fused = {
        cells[2].strip(): int(cells[5])
        for cells in (line.split("|") for line in stdout.splitlines())
        if len(cells) > 5 and cells[1].strip() == "this checkout"
    }
    assert fused == {"a first version": 18, "--dedup content, two splits": 29}, stdout


def test_the_spec_is_handed_down_entering_each_module_once():
    """The redesign's target: following the spec from convert() to the pipeline's submission visits
    each module once, in data-flow order (no call runs back up into a module already left)."""
    stdout = _benchmark_output("spec_walk.py", timeout=300)
    calls = [line for line in stdout.splitlines() if ".py:" in line]
    modules = list(dict.fromkeys(line.split(":")[0] for line in calls))
    assert modules[modules.index("api.py") :] == [
        "api.py",
        "command_line/run_console.py",
        "run.py",
        "preflight.py",
        "convert_images.py",
    ], calls
    assert stdout.strip().endswith("0 of them entered again after being left"), stdout

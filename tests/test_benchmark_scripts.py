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
    for candidate in (
        "pillow bicubic (the first releases' default)",
        "script bilinear",
        "dct >= 1.1x + pillow bicubic",
        "dct >= 1.1x + sinc prefilter + cubic (the job's default)",
    ):
        (row,) = [row for row in rows if row.startswith(f"| {candidate}")]
        ms, speed, psnr = (cell.strip() for cell in row.split("|")[2:5])
        assert float(ms) > 0 and speed.endswith("x") and 25 < float(psnr) < 60, row
    for resampler in (
        "pillow bicubic",
        "pillow bilinear",
        "linear (prefilter from 1.5x)",
        "job dct_sinc (the default)",
    ):
        patterns = [row for row in rows if row.startswith(f"| {resampler} |")]
        assert len(patterns) == 4, stdout
    # At 8x every pattern is flat through Pillow's bicubic: the measure can tell flat from not.
    bicubic = [row.split("|") for row in rows if row.startswith("| pillow bicubic |")]
    assert all(float(cells[-2]) < 5 for cells in bicubic)
    assert any(float(cells[3]) > 20 for cells in bicubic)  # at 1.2x, the stripes come through


def test_the_pipeline_keeps_the_stage_counts_the_docs_state():
    """README and docs/benchmarks.md state 16 fused stages for a first version (26 with --dedup
    content and two splits): a change that adds stages back fails here, where it is cheap to see."""
    stdout = _benchmark_output("pipeline_shape.py", timeout=600)
    fused = {
        cells[2].strip(): int(cells[5])
        for cells in (line.split("|") for line in stdout.splitlines())
        if len(cells) > 5 and cells[1].strip() == "this checkout"
    }
    assert fused == {"a first version": 16, "--dedup content, two splits": 26}, stdout


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


def test_the_peers_benchmark_reads_back_and_scores_what_each_contender_wrote(tmp_path):
    """Without the peers (CI installs none): the job and the Pillow scripts, timed, read back and
    scored; none of the peers' environments is made."""
    peers_venv = tmp_path / "peers-venv"
    stdout = _benchmark_output(
        "peers.py",
        *("--num_images", "12", "--repeats", "1", "--only", "job,pool,pool_bicubic"),
        *("--work_dir", str(tmp_path), "--peers_venv", str(peers_venv)),
        timeout=300,
    )
    rows = {line.split("|")[1].split(":")[0].strip(): line for line in stdout.splitlines() if line.startswith("| ")}
    for name in ("job", "pool", "pool_bicubic"):
        seconds, rate, speed_up, psnr, quality, records = (cell.strip() for cell in rows[name].split("|")[2:-1])
        assert float(seconds) > 0 and float(rate) > 0 and speed_up.endswith("x"), rows[name]
        assert 30 < float(psnr) < 60 and quality == "95" and records == "12 ok", rows[name]
    assert not peers_venv.exists()

"""inspect after the plain `pip install .`: the whole report, with no optional package."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from PIL import Image

_REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_report_is_whole_without_matplotlib(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # What Python does for a package that is not installed: its import raises ImportError.
    blocked = tmp_path / "site" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{_REPO}"}
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.inspect", str(jpeg_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # nothing missing, and none of TensorFlow's start-up lines either
    assert sorted(p.name for p in out.iterdir()) == [
        "class_counts.png",
        "contact_sheet-train.png",
        "contact_sheet-validation.png",
        "report.html",
    ]
    chart = Image.open(out / "class_counts.png")
    assert chart.format == "PNG" and chart.width > 200 and chart.height > 100
    assert "data:image/png;base64," in (out / "report.html").read_text(encoding="utf-8")

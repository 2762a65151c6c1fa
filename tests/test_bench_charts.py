"""The benchmarks' bar chart: its size, and that it refuses a baseline it was not given."""

from __future__ import annotations

import pytest
from PIL import Image

from benchmarks._charts import chart_size, rate_chart


def test_rate_chart_draws_every_pipeline_at_a_known_size(tmp_path):
    rates = {"ours": 2900.0, "from_generator": 283.0, "decode limit": 3600.0}
    path = rate_chart(rates, tmp_path / "sub" / "chart.png", title="t", baseline="from_generator", limit="decode limit")
    image = Image.open(path)
    assert image.format == "PNG" and image.size == chart_size(3)
    pixels = image.convert("RGB")
    colours = {pixels.getpixel((x, y)) for x in range(0, image.width, 4) for y in range(0, image.height, 4)}
    assert {(0x9E, 0x9E, 0x9E), (0xC6, 0x28, 0x28), (0x1F, 0x6F, 0xB2)} <= colours  # baseline, limit, the rest


def test_rate_chart_refuses_an_unknown_baseline(tmp_path):
    with pytest.raises(ValueError, match="not among the measured pipelines"):
        rate_chart({"a": 1.0}, tmp_path / "c.png", title="t", baseline="b")

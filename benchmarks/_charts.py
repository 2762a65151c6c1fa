"""Bar charts of benchmark results: images/s per pipeline, with the baseline and the limit marked.

matplotlib with the Agg backend (no display needed); install it with `pip install ".[bench]"`.
"""

from __future__ import annotations

import pathlib

__all__ = ["chart_size", "rate_chart"]

_DPI = 100


def chart_size(num_bars: int) -> tuple[int, int]:
    """(width, height) in pixels: a fixed width, a row per pipeline."""
    return 1100, round((1.8 + 0.42 * max(1, num_bars)) * _DPI)


def rate_chart(
    rates: dict[str, float],
    path: pathlib.Path | str,
    *,
    title: str,
    baseline: str | None = None,
    limit: str | None = None,
    unit: str = "images/s",
) -> pathlib.Path:
    """Writes a horizontal bar chart of `rates` (in the table's order, top to bottom) to `path`.

    `baseline` (the pipeline the others are compared with) is drawn grey, with a dashed line at
    its rate; `limit` (the decode-only ceiling) red, with a dotted line. Each bar is labelled with
    its rate and, when there is a baseline, its multiple of it.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    missing = [name for name in (baseline, limit) if name is not None and name not in rates]
    if missing:
        raise ValueError(f"{missing} not among the measured pipelines {list(rates)}")
    names = list(rates)[::-1]
    values = [rates[name] for name in names]
    colours = ["#9e9e9e" if name == baseline else "#c62828" if name == limit else "#1f6fb2" for name in names]
    width, height = chart_size(len(names))
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    axes = figure.add_subplot()
    bars = axes.barh(names, values, color=colours)
    peak = max(values, default=1.0)
    base = rates.get(baseline) if baseline else None
    for bar, value in zip(bars, values, strict=True):
        label = f"{value:,.0f}" + (f"  ({value / base:.1f}x)" if base else "")
        axes.text(bar.get_width() + peak * 0.01, bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    if base:
        axes.axvline(base, color="#616161", linestyle="--", linewidth=1, label=f"baseline: {baseline}")
    if limit:
        axes.axvline(rates[limit], color="#c62828", linestyle=":", linewidth=1.2, label=f"limit: {limit}")
    if base or limit:
        # At the foot of the figure, where it can cover no bar.
        figure.legend(
            *axes.get_legend_handles_labels(),
            loc="lower center",
            bbox_to_anchor=(0.5, 0.01),
            ncol=2,
            fontsize=8,
            frameon=False,
        )
    axes.set_xlim(0, peak * 1.25)
    axes.set_xlabel(unit)
    axes.tick_params(axis="y", labelsize=8)
    figure.suptitle(title, fontsize=10)  # centred on the figure: the bars' axes start far right of the names
    figure.subplots_adjust(left=0.42, right=0.97, top=1 - 0.45 / (height / _DPI), bottom=0.95 / (height / _DPI))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=_DPI)
    return path

"""The class histogram per split, sorted, with its imbalance ratio and empty classes flagged."""

from __future__ import annotations

import dataclasses
import io

__all__ = ["Balance", "balance", "chart_size", "draw_class_counts"]

_DPI = 100


@dataclasses.dataclass(frozen=True)
class Balance:
    """`ratio` is largest / smallest non-empty class (None when no class has an example);
    `empty` the classes with none, which a ratio would hide."""

    ratio: float | None
    largest: str | None
    smallest: str | None
    empty: tuple[str, ...]


def balance(counts: dict[str, int]) -> Balance:
    """Pure: the imbalance of one split's {class: examples}."""
    present = {name: n for name, n in counts.items() if n > 0}
    empty = tuple(sorted(name for name, n in counts.items() if n <= 0))
    if not present:
        return Balance(None, None, None, empty)
    largest = max(sorted(present), key=present.get)
    smallest = min(sorted(present), key=present.get)
    return Balance(present[largest] / present[smallest], largest, smallest, empty)


def chart_size(num_splits: int, num_classes: int) -> tuple[int, int]:
    """(width, height) in pixels of the chart: one panel per split side by side, a bar per class."""
    width_in = 1.0 + 5.0 * max(1, num_splits)
    height_in = 1.6 + 0.32 * max(1, num_classes)
    return round(width_in * _DPI), round(height_in * _DPI)


def draw_class_counts(counts_by_split: dict[str, dict[str, int]], *, title: str = "") -> bytes:
    """PNG bytes: per split, horizontal bars from the largest class down; empty classes in red.

    matplotlib's Agg backend draws without a display; the figure is sized by `chart_size` and
    saved without tight cropping, so the picture has exactly that size.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    splits = list(counts_by_split)
    num_classes = max((len(c) for c in counts_by_split.values()), default=1)
    width, height = chart_size(len(splits), num_classes)
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    axes_list = figure.subplots(1, max(1, len(splits)), squeeze=False)[0]
    for axes, split in zip(axes_list, splits or [""]):
        counts = counts_by_split.get(split, {})
        ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        names = [name for name, _ in ordered][::-1]
        values = [n for _, n in ordered][::-1]
        colours = ["#c62828" if n == 0 else "#1f6fb2" for n in values]
        bars = axes.barh(names, values, color=colours)
        peak = max(values, default=0)
        for bar, n in zip(bars, values):
            label = "EMPTY" if n == 0 else str(n)
            axes.text(bar.get_width() + peak * 0.01, bar.get_y() + bar.get_height() / 2, label, va="center",
                      fontsize=8, color="#c62828" if n == 0 else "#222222")
        axes.set_xlim(0, max(1, peak) * 1.15)
        summary = balance(counts)
        ratio = "no examples" if summary.ratio is None else f"largest/smallest {summary.ratio:.1f}"
        flag = f", {len(summary.empty)} empty" if summary.empty else ""
        axes.set_title(f"{split}: {sum(values)} examples\n{ratio}{flag}", fontsize=10)
        axes.tick_params(axis="y", labelsize=8)
        axes.set_xlabel("examples")
    if title:
        figure.suptitle(title, fontsize=11)
    figure.subplots_adjust(left=0.08 + 0.06 / max(1, len(splits)), right=0.97, top=1 - 0.75 / (height / _DPI),
                           bottom=0.5 / (height / _DPI), wspace=0.45)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()

"""Showing a job's progress: a tqdm bar on a terminal, a plain line about every 10% elsewhere."""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

from tqdm import tqdm

from beam_jobs.command_line.progress import Progress

__all__ = ["LineProgress", "TtyProgress", "format_duration", "progress_line"]


def format_duration(seconds: float) -> str:
    """Seconds as M:SS, or H:MM:SS from an hour on, as the progress line's elapsed time and ETA read."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_rate(images_per_s: float) -> str:
    """A rate as a person reads it: whole images from 10/s on, one decimal below (a small run's
    0.4 images/s is not "0 images/s"), and "1 image/s" in the singular. Pure."""
    shown = f"{images_per_s:.0f}" if images_per_s >= 10 else f"{images_per_s:.1f}".removesuffix(".0")
    return f"{shown} image/s" if shown == "1" else f"{shown} images/s"


def progress_line(progress: Progress, *, elapsed_s: float) -> str:
    """One plain line: shards, images, percentage, rate and ETA. Pure, for logs and CI consoles.

    The images of shards kept by --resume are left out of the rate, which they would inflate.
    """
    converted = progress.images_done - progress.images_kept
    rate = converted / elapsed_s if elapsed_s > 0 else 0.0
    left = progress.images_total - progress.images_done
    eta = f", ETA {format_duration(left / rate)}" if rate > 0 and left > 0 else ""
    return (
        f"progress: {progress.shards_done}/{progress.shards_total} shards, {progress.images_done}/"
        f"{progress.images_total} images ({progress.fraction:.0%}), {format_rate(rate)}{eta}, "
        f"{format_duration(elapsed_s)} elapsed"
    )


class LineProgress:
    """Writes the plan's line, then one progress line each time another tenth is done.

    The tenths count from zero whatever the progress when the plan is first seen: on a slow
    listing, shards may be staged before the plan file shows, and they are this run's work.
    """

    def __init__(self, out: TextIO, lock: threading.Lock) -> None:
        self._out = out
        self._lock = lock
        self._started = time.monotonic()
        self._tenths = 0

    def write(self, text: str) -> None:
        """Writes ``text`` as one whole line, holding the console's lock so that no other line cuts into it."""
        with self._lock:
            self._out.write(text.rstrip("\n") + "\n")
            self._out.flush()

    def plan(self, line: str, progress: Progress) -> None:
        """Called once the plan is known: writes the plan's line, then the progress so far."""
        self.write(line)
        self.update(progress)

    def update(self, progress: Progress) -> None:
        """Writes a progress line only when another tenth is done, so that a log gets about ten of them."""
        tenths = int(progress.fraction * 10)
        if tenths > self._tenths:
            self._tenths = tenths
            self.write(progress_line(progress, elapsed_s=time.monotonic() - self._started))

    def close(self) -> None:
        """Nothing to tear down: every line is complete once written. Here so that either display closes alike."""
        pass


def _fixed_size(out: TextIO) -> dict:
    """{} where the terminal reports its size (tqdm then follows it), else a fixed 100x24: tqdm
    draws nothing on a terminal that reports 0 columns or rows (a pty with no window, as under
    `script` or some CI runners)."""
    try:
        size = os.get_terminal_size(out.fileno())
        if size.columns > 0 and size.lines > 0:
            return {"dynamic_ncols": True}
    except (OSError, ValueError):
        pass
    return {"ncols": 100, "nrows": 24}


class TtyProgress:
    """A tqdm bar of images, with shards done of total; other console lines print above it."""

    _FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} images [{elapsed}<{remaining}, {rate_fmt}]{postfix}"

    def __init__(self, out: TextIO, lock: threading.Lock) -> None:
        self._out = out
        self._lock = lock
        self._bar: tqdm | None = None
        self._kept = 0

    def write(self, text: str) -> None:
        """Prints a console line above the bar (tqdm clears and redraws it), or plainly before the bar exists."""
        with self._lock:
            if self._bar is None:
                self._out.write(text.rstrip("\n") + "\n")
                self._out.flush()
            else:
                self._bar.write(text.rstrip("\n"), file=self._out)

    def plan(self, line: str, progress: Progress) -> None:
        """Writes the plan's line and opens the bar on the plan's total of images."""
        self.write(line)
        with self._lock:
            self._kept = progress.images_kept
            # initial: the kept images are no work of this run, and tqdm leaves them out of its rate.
            self._bar = tqdm(
                total=progress.images_total,
                initial=progress.images_kept,
                file=self._out,
                unit="img",
                desc="converting",
                bar_format=self._FORMAT,
                smoothing=0.1,
                **_fixed_size(self._out),
            )
        self.update(progress)

    def update(self, progress: Progress) -> None:
        """Moves the bar to ``progress``: images kept by --resume count as done without entering the rate."""
        with self._lock:
            if self._bar is None:
                return
            kept = progress.images_kept - self._kept
            if kept > 0:
                # Shards kept by --resume count as done at once, without entering the rate.
                self._kept = progress.images_kept
                self._bar.initial += kept
                self._bar.n += kept
                self._bar.last_print_n += kept
            self._bar.set_postfix_str(f"shards {progress.shards_done}/{progress.shards_total}", refresh=False)
            converted = progress.images_done - self._bar.n
            if converted:
                self._bar.update(converted)
            else:  # Kept shards or the shard count alone changed: tqdm draws only on update().
                self._bar.refresh()

    def close(self) -> None:
        """Closes the bar, leaving its last state on the terminal; later lines print plainly."""
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

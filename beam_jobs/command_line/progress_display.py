"""Showing a job's progress: a tqdm bar on a terminal; elsewhere a plain line at every 10%, and at least every 30 s."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

from beam_jobs.command_line.progress import Progress

__all__ = ["LineProgress", "RateMeter", "TtyProgress", "format_duration", "progress_line"]


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


def progress_line(progress: Progress, *, elapsed_s: float, rate: float | None) -> str:
    """One plain line: shards, images, percentage, rate and ETA, and the time elapsed. Pure, for
    logs and CI consoles; ``rate`` (images/s) is None until one can be measured (RateMeter)."""
    left = progress.images_total - progress.images_done
    speed = "" if rate is None else f", {format_rate(rate)}"
    eta = f", ETA {format_duration(left / rate)}" if rate and left > 0 else ""
    return (
        f"progress: {progress.shards_done}/{progress.shards_total} shards, {progress.images_done}/"
        f"{progress.images_total} images ({progress.fraction:.0%}){speed}{eta}, "
        f"{format_duration(elapsed_s)} elapsed"
    )


class RateMeter:
    """Images per second since the first converted images were seen, not since the launch.

    The launch is followed by seconds (locally) to minutes (a cluster) of imports, workers and
    listing before any image is converted, and a rate over that time would promise an ETA far
    too late. Images of shards kept by --resume are no work of this run, and are left out by the
    caller (``converted``). Pure apart from the times it is given.
    """

    MIN_SPAN_S = 1.0  # below this, a rate is noise

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None

    def rate(self, converted: int, now: float) -> float | None:
        """The rate from the first sighting of converted images to ``now``; None before it can be told."""
        if self._first is None:
            if converted > 0:
                self._first = (now, converted)
            return None
        began, base = self._first
        return None if now - began < self.MIN_SPAN_S else (converted - base) / (now - began)


class LineProgress:
    """Writes the plan's line, then a progress line each time another tenth is done, and one at
    least every HEARTBEAT_S while nothing else is printed: a log then shows that a slow job (a
    cluster starting its workers, a shard of large images) is alive and where it is.

    The tenths count from zero whatever the progress when the plan is first seen: on a slow
    listing, shards may be staged before the plan file shows, and they are this run's work.
    """

    HEARTBEAT_S = 30.0

    def __init__(self, out: TextIO, lock: threading.Lock, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._out = out
        self._lock = lock
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._tenths = 0
        self._meter = RateMeter()

    def write(self, text: str) -> None:
        """Writes ``text`` as one whole line, holding the console's lock so that no other line cuts into it."""
        with self._lock:
            self._out.write(text.rstrip("\n") + "\n")
            self._out.flush()

    def plan(self, line: str, progress: Progress) -> None:
        """Called once the plan is known: writes the plan's line, then the progress so far."""
        self.write(line)
        self._last_line = self._clock()
        self.update(progress)

    def update(self, progress: Progress) -> None:
        """Called after each look at the output folder: writes a line at another tenth, or once a heartbeat is due."""
        now = self._clock()
        rate = self._meter.rate(progress.images_done - progress.images_kept, now)
        tenths = int(progress.fraction * 10)
        if tenths > self._tenths or now - self._last_line >= self.HEARTBEAT_S:
            self._tenths = max(tenths, self._tenths)
            self._last_line = now
            self.write(progress_line(progress, elapsed_s=now - self._started, rate=rate))

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

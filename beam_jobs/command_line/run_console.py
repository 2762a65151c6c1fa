"""What a terminal shows while a run goes on: its progress (a bar on a terminal, else a line about
every 10%), the runner's own UI when it has one, no worker tracebacks, and one line if it is
interrupted. The run (beam_jobs/run.py) is handed a ``TerminalConsole`` by the command line and
by ``beam_jobs.convert``; it never imports the console itself.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from beam_jobs.command_line.console import ConsoleFilter, hide_worker_tracebacks
from beam_jobs.command_line.progress import StagingWatcher
from beam_jobs.command_line.progress_display import LineProgress, TtyProgress
from beam_jobs.command_line.runner_ui import watch_hint
from beam_jobs.command_line.termination import interrupted_line
from beam_jobs.writing.run_folders import run_dir

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.runner import PipelineResult

    from beam_jobs.interruption import InterruptedState
    from beam_jobs.spec import ConversionSpec

__all__ = ["TerminalConsole"]


def _write_to(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (ValueError, OSError):  # Closed: nowhere left to say it.
        pass


class TerminalConsole:
    """The run.RunConsole of the command line and of convert(): the terminal's view of one run."""

    def __init__(self, spec: ConversionSpec, options: PipelineOptions) -> None:
        self._spec = spec
        self._options = options
        self._terminal: TextIO | None = None  # the real terminal while showing (stderr is filtered then)

    def stuck(self, signum: int, state: InterruptedState | None) -> None:
        """The interrupt's one line, when the interrupt never reached the run's own cleanup."""
        line = interrupted_line(overwrite=self._spec.mode.overwrite, terminated=signum == signal.SIGTERM, state=state)
        _write_to(self._terminal or sys.stderr, line + "\n")

    @contextlib.contextmanager
    def showing(self, run_id: str | None) -> Iterator[_Shown]:
        """While the pipeline runs: worker tracebacks filtered out, and the run's progress shown."""
        spec = self._spec
        with hide_worker_tracebacks(enabled=spec.log_level != "DEBUG") as console:
            self._terminal = console.terminal
            shown = _Shown(console, self._options)
            if run_id is not None:
                shown.watch(run_dir(spec.output_dir, run_id), run_id, plain=spec.log_level == "DEBUG")
            try:
                yield shown
            finally:
                shown.close()
                self._terminal = None  # stderr is the terminal again


class _Shown:
    """One run on the terminal: its progress display, the runner's hint, and the mute switch."""

    def __init__(self, console: ConsoleFilter, options: PipelineOptions) -> None:
        self._console = console
        self._options = options
        self._watcher: StagingWatcher | None = None
        self._display: LineProgress | TtyProgress | None = None
        self._succeeded = False

    def watch(self, folder: str, run_id: str, *, plain: bool) -> None:
        """Starts watching the run's folder: a bar on a terminal, else a line about every 10%."""
        tty = not plain and self._console.terminal.isatty()
        display = (TtyProgress if tty else LineProgress)(self._console.terminal, self._console.lock)
        if tty:
            self._console.sink = display.write  # Lines that pass the filter print above the bar.
        self._watcher = StagingWatcher(folder, run_id, on_plan=display.plan, on_progress=display.update).start()
        self._display = display

    def submitted(self, result: PipelineResult) -> None:
        """Where to follow the job, when its runner has a UI or logs of its own."""
        job_id = getattr(result, "job_id", None)
        hint = watch_hint(self._options, job_id() if callable(job_id) else None)
        if hint:
            self._console.emit(hint + "\n")

    def finished(self) -> None:
        self._succeeded = True

    def mute(self) -> None:
        """Interrupted: the workers' dying words would bury the one line that matters."""
        self._console.mute()

    def close(self) -> None:
        if self._watcher is not None and self._display is not None:
            self._watcher.stop(succeeded=self._succeeded)
            self._console.sink = None
            self._display.close()
            self._watcher.remove_progress_file()

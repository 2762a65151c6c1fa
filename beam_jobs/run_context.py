"""RunContext: what one run of a spec found and chose before its pipeline was built."""

from __future__ import annotations

from dataclasses import dataclass

from beam_jobs.writing.commit import Current
from beam_jobs.writing.convert_shards import CONVERT_THREADS

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """What one run of a spec found and chose before its pipeline was built.

    Attributes:
      run_id: the run's name: its folder under shards/ and its progress file (None: a plan only).
      expected: the version current when the run started; it commits only if that still is.
      change_kind: "create", "overwrite" or "append": what the commit records.
      convert_threads: images each worker converts at once (ConvertShardFn).
    """

    run_id: str | None
    expected: Current | None
    change_kind: str = "create"
    convert_threads: int = CONVERT_THREADS

    @property
    def appended_to(self) -> Current | None:
        """The version an append adds to (None for any other run)."""
        if self.change_kind == "append" and self.expected is not None and self.expected.manifest is not None:
            return self.expected
        return None

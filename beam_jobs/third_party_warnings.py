"""Python warnings (``warnings.warn``) go to the log at DEBUG, never straight to the console.

The job says what a user must know in its own lines and its own logged warnings; the warnings
module is how libraries talk to their developers (pycocotools' "``__array__`` implementation doesn't
accept a copy keyword" under NumPy 2, Beam's deprecations), and printed it buries the job's lines:
six of them a run with ``--coco_masks``. Whether a warning is issued still follows Python's
filters (``-W error`` still makes one an error); only where a shown one goes changes.

The decode step turns the warnings filter to "always" while Pillow decodes (decode.py), and that
filter is process-wide, so a library warning raised on another thread meanwhile is shown
whatever the default filters say: the console cannot rely on the filters to stay quiet.
"""

from __future__ import annotations

import logging
import warnings
from typing import TextIO

__all__ = ["WARNINGS_LOGGER", "warnings_to_debug_log"]

# The logger Python's own logging.captureWarnings uses: the familiar name for these records.
WARNINGS_LOGGER = "py.warnings"
_LOG = logging.getLogger(WARNINGS_LOGGER)


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,  # pylint: disable=unused-argument  # the console is what this avoids
    line: str | None = None,
) -> None:
    _LOG.debug("%s", warnings.formatwarning(message, category, filename, lineno, line).rstrip())


def warnings_to_debug_log() -> None:
    """From now on in this process, every warning shown is a DEBUG record of ``py.warnings``:
    ``--log_level DEBUG`` shows them, other levels do not. Called by the launching process and by
    each worker (local_worker.py for the local runner's, the converter's setup on every runner)."""
    warnings.showwarning = _log_warning

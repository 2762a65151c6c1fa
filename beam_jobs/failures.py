"""One line for a failed run: the job's own message when the failure is its own, the storage
problem when the disk said no, else the innermost error and the step it failed in.

Runners re-raise a worker's exception as their own, with the worker's traceback as text; this
reads the job's meaning back out of it, for the command line's error line and for convert().
"""

from __future__ import annotations

import re

from beam_jobs.errors import JobError, UsageError
from beam_jobs.paths import redact
from beam_jobs.writing.append import SourceChangesError
from beam_jobs.writing.commit import CommitConflictError
from beam_jobs.writing.finalize import TooManyBadInputsError
from beam_jobs.writing.run_lock import OutputLockedError

__all__ = ["describe_failure"]


_STORAGE_ERRORS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")
# What the FnApiRunner raises when one of its worker processes dies (killed, out of memory).
_WORKER_LOST = ("Channel closed prematurely", "Worker subprocess exited with return code")
# The last "SomeError: message" line of a traceback, as runners pass worker failures on in text.
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit)): (.+)$", re.MULTILINE)
# Runners append the failing step to the message; it is worth keeping, the Java-side noise is not.
_STEP = re.compile(r"\[while running '([^']+)'\]")


def describe_failure(error: BaseException) -> tuple[str, bool]:
    """One line for a failed run, and whether a trace would help: our own message when the failure
    is ours, the storage problem when the disk said no, else the innermost error and its step."""
    text = redact(f"{type(error).__name__}: {error}")
    for own in (
        TooManyBadInputsError,
        OutputLockedError,
        SourceChangesError,
        CommitConflictError,
        JobError,
        UsageError,
    ):
        matches = re.findall(rf"{own.__name__}: (.+)", text)
        if matches:
            return _STEP.sub("", matches[-1]).strip(), False
    for needle in _STORAGE_ERRORS:
        if needle in text:
            where = re.search(rf"{re.escape(needle)}[^\n]*?: '([^']+)'", text)
            return (
                f"could not write the output: {needle}"
                + (f" ({where.group(1)})" if where else "")
                + "; nothing was committed (dataset_info.json, and the version it names, if any, are as "
                "they were; the shards completed so far stay in the run's folder for --resume)"
            ), False
    lost = _lost_job_service(error)
    if lost:
        return lost, False
    if any(needle in text for needle in _WORKER_LOST):
        return (
            "a worker process of the local runner ended without finishing its work (was it killed, or "
            "out of memory?); nothing was committed (dataset_info.json, and the version it names, if any, "
            "are as they were; the shards completed so far stay in the run's folder for --resume)"
        ), True
    lines = [m for m in _ERROR_LINE.finditer(text) if not m.group(2).startswith("[while running")]
    step = _STEP.findall(text)
    if not lines:
        first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        return first[:500], True
    name, message = lines[-1].group(1), _STEP.sub("", lines[-1].group(2)).strip()
    in_step = f" (in step {step[-1]})" if step else ""
    return f"{name}: {message[:500]}{in_step}", True


def _lost_job_service(error: BaseException) -> str | None:
    """The line for a portable runner whose job service went away mid-run (its process was
    killed, say), where the error is gRPC's stream object, whose text names no cause."""
    import grpc  # Beam's own dependency; here only when a run has failed

    if not isinstance(error, grpc.RpcError) or not callable(getattr(error, "code", None)):
        return None
    code = error.code()
    details = error.details() if callable(getattr(error, "details", None)) else ""
    return redact(
        f"lost the connection to the runner's job service (gRPC {getattr(code, 'name', code)}: {details}); "
        "its job may still be running on the cluster, and commit: look at the cluster before a --resume"
    )

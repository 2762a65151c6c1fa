"""Reasons an input can be refused, and the error that carries one to the dead letters."""

from __future__ import annotations

__all__ = ["BadInputError", "JobError", "Reason", "Stage", "UsageError", "WorkerShutdownError"]


class Stage:
    """Where in the job an input was refused (the ``stage`` field of a dead letter)."""

    LIST = "list"
    READ = "read"
    DECODE = "decode"
    PREPROCESS = "preprocess"
    ENCODE = "encode"
    CONVERT = "convert"


class Reason:
    """Why an input was refused (the ``reason`` field of a dead letter, and a metric name)."""

    EMPTY_FILE = "empty_file"
    FILE_TOO_LARGE = "file_too_large"
    READ_ERROR = "read_error"
    READ_TIMEOUT = "read_timeout"
    NOT_AN_IMAGE = "not_an_image"
    FORMAT_NOT_ALLOWED = "format_not_allowed"
    TOO_MANY_PIXELS = "too_many_pixels"
    TRUNCATED = "truncated"
    DECODE_ERROR = "decode_error"
    UNSUPPORTED_MODE = "unsupported_mode"
    UNEXPECTED_ERROR = "unexpected_error"
    DECODER_TIMEOUT = "decoder_timeout"
    DECODER_CRASHED = "decoder_crashed"
    BAD_MANIFEST_ROW = "bad_manifest_row"
    OUTSIDE_INPUT_ROOT = "outside_input_root"
    NOT_A_REGULAR_FILE = "not_a_regular_file"
    DANGLING_SYMLINK = "dangling_symlink"
    SYMLINK_LOOP = "symlink_loop"
    DUPLICATE_INPUT = "duplicate_input"
    DUPLICATE_CONTENT = "duplicate_content"
    CONFLICTING_LABELS = "conflicting_labels"
    UNEXPECTED_LAYOUT = "unexpected_layout"
    BAD_LABEL = "bad_label"
    # --append with split groups: a new input near held examples in two splits, so a leak in either.
    NEAR_COPY_ACROSS_SPLITS = "near_copy_across_splits"


class BadInputError(Exception):
    """An input that cannot become a training example; it goes to the dead letters, not up the stack."""

    def __init__(self, stage: str, reason: str, detail: str) -> None:
        super().__init__(f"{stage}/{reason}: {detail}")
        self.stage = stage
        self.reason = reason
        self.detail = detail

    def __reduce__(self):
        # Crosses process boundaries (isolated decodes, Beam workers) with its fields intact.
        return type(self), (self.stage, self.reason, self.detail)


class JobError(ValueError):
    """The job as a whole cannot go on (no images found, an unreadable input list): its message is
    what the user sees, as one line, wherever in the pipeline it was raised."""


class WorkerShutdownError(RuntimeError):
    """The worker is shutting down under a shard being converted (its runner died or cancelled the
    work). It fails the shard, which is never staged: blaming each remaining image with a dead
    letter would record a broken shard as complete, and --resume would trust it."""


class UsageError(ValueError):
    """A command line (or ``convert`` call) the job refuses before doing anything; the command line
    shows it as one line and exits 2."""

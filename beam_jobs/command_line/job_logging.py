"""The job's logging: its own lines on the console, Beam's and the runners' chatter in the log
file only, credentials hidden everywhere, and the caller's own logging left as it was.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence

from beam_jobs.command_line.arguments import (
    UsageError,
    expand_verbosity,
)
from beam_jobs.command_line.console import RelayedWorkerRecords
from beam_jobs.convert_images import LOG_PLAN_STEP  # the plan line's step: its relayed copy is not shown
from beam_jobs.local_runner import QUIET_LOGGERS
from beam_jobs.third_party_warnings import warnings_to_debug_log
from beam_jobs.writing.finalize import (
    TooManyBadInputsError,
)

__all__ = [
    "LOG_PLAN_STEP",
    "callers_logging_kept",
    "configure_job_logging",
    "configure_logging_for",
    "peek_log_level",
]


def peek_log_level(argv: Sequence[str]) -> str:
    """--log_level (or -v) before the full parse, so that logging is set up before Beam says anything."""
    try:
        argv = expand_verbosity(argv)
    except UsageError:  # Reported by the full parse.
        pass
    for index, arg in enumerate(argv):
        if arg.startswith("--log_level="):
            return arg.split("=", 1)[1].upper()
        if arg == "--log_level" and index + 1 < len(argv):
            return argv[index + 1].upper()
    return "WARNING"


class _HideRunnerTraces(logging.Filter):
    """Below DEBUG, a failure is told in one line at the end; the runner's own logged copies of
    the worker's traceback (and of the bad-fraction refusal) would only bury it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and (
            record.exc_info or "Traceback (most recent call last)" in record.getMessage()
        ):
            return False
        return TooManyBadInputsError.__name__ not in record.getMessage()


class _ConsoleFormatter(logging.Formatter):
    """The job's own notices read as plain sentences; anything else (a warning, Beam's lines at
    --log_level INFO) says its level and origin; DEBUG adds timestamps."""

    def __init__(self, level: int) -> None:
        prefix = "%(asctime)s " if level <= logging.DEBUG else ""
        super().__init__(prefix + "%(levelname)s %(name)s: %(message)s")
        self._plain = logging.Formatter(prefix + "%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO and record.name.startswith("beam_jobs"):
            return self._plain.format(record)
        return super().format(record)


# Credential options: their values never reach a log line the job prints.
_CREDENTIAL_FLAGS = ("--s3_access_key_id", "--s3_secret_access_key", "--s3_session_token", "--azure_connection_string")
# At --log_level INFO, a line for each type hint of each step: only DEBUG shows them.
_CHATTY_BELOW_DEBUG = ("apache_beam.typehints.native_type_compatibility",)


def _credential_values(argv: Sequence[str]) -> list[str]:
    """The values given to credential flags, as ``--flag value`` or ``--flag=value``."""
    values = []
    for index, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name in _CREDENTIAL_FLAGS:
            value = value if sep else (argv[index + 1] if index + 1 < len(argv) else "")
            if len(value) >= 4:  # A one-letter "key" would redact every word holding that letter.
                values.append(value)
    return sorted(set(values), key=len, reverse=True)


class _HideCredentials(logging.Filter):
    """Replaces the credential values given on the command line wherever a log line holds them:
    the runner relays workers' lines (their options included) as text, so matching by value is
    what catches them all."""

    def __init__(self, values: list[str]) -> None:
        super().__init__()
        self._values = values

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(value in message for value in self._values):
            for value in self._values:
                message = message.replace(value, "<redacted>")
            record.msg, record.args = message, None
        return True


def configure_job_logging(argv: Sequence[str]) -> str:
    """Sets up the console's logging for a run of ``argv`` (its --log_level, credentials hidden)
    before the command line is parsed, so that logging is in place before Beam says anything;
    returns the level."""
    level = peek_log_level(argv)
    configure_logging_for(level, argv)
    return level


def configure_logging_for(level: str, runner_args: Sequence[str], *, keep_handlers: bool = False) -> None:
    """Sets up the console's logging at ``level``, with the credentials among ``runner_args``
    hidden. ``beam_jobs.convert`` keeps the caller's handlers (see ``callers_logging_kept``)."""
    _configure_logging(level, secrets=_credential_values(runner_args), force=not keep_handlers)
    warnings_to_debug_log()


def _touched_loggers() -> list[str]:
    return ["beam_jobs", "beam_jobs.details", *QUIET_LOGGERS, *_CHATTY_BELOW_DEBUG]


@contextlib.contextmanager
def callers_logging_kept() -> Iterator[None]:
    """Puts the logging configuration back as it was when the block ends: the root logger's
    handlers, their formatters and filters, and the levels the job sets. A notebook's or an
    application's own logging must not be replaced by one call of ``beam_jobs.convert``."""
    root = logging.getLogger()
    handlers = [(handler, handler.formatter, list(handler.filters)) for handler in root.handlers]
    levels = {name: logging.getLogger(name).level for name in ["", *_touched_loggers()]}
    show_warning = warnings.showwarning
    try:
        yield
    finally:
        warnings.showwarning = show_warning
        kept = [handler for handler, _, _ in handlers]
        for handler in list(root.handlers):
            if handler not in kept:
                root.removeHandler(handler)
                handler.close()
        for handler, formatter, filters in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
            handler.setFormatter(formatter)
            handler.filters[:] = filters
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _configure_logging(level: str, *, secrets: Sequence[str] = (), force: bool = True) -> None:
    numeric = getattr(logging, level, logging.WARNING)
    # force: Beam's import logs through the root logger, which configures it with logging's
    # bare "INFO:name:message" format before this runs. Without force, the caller's handlers stay
    # (one is made only where there is none) and only their format and filters change.
    logging.basicConfig(level=numeric, force=force)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_ConsoleFormatter(numeric))
    logging.getLogger().setLevel(numeric)
    logging.getLogger("beam_jobs").setLevel(min(numeric, logging.INFO))
    logging.getLogger("beam_jobs.details").setLevel(numeric)
    for name, quiet in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(max(numeric, getattr(logging, quiet)))
    for name in _CHATTY_BELOW_DEBUG:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING) if numeric > logging.DEBUG else numeric)
    for handler in logging.getLogger().handlers:
        # First: the filters below read the relayed record's own message.
        handler.addFilter(RelayedWorkerRecords(drop_steps=(LOG_PLAN_STEP,)))
        if secrets:
            handler.addFilter(_HideCredentials(list(secrets)))
        if numeric > logging.DEBUG:
            handler.addFilter(_HideRunnerTraces())

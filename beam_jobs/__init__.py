"""Apache Beam job that converts raw image collections into deterministic, sharded TFRecords."""

import logging as _logging

__version__ = "0.1.0"


class _WithoutGcpExtraNotice(_logging.Filter):
    """Beam logs, on import, that apitools is missing whenever the [gcp] extra is not installed.
    It is not a problem for local or S3 data (gs:// without the extra fails with a clear error),
    and it would be the first line of every run."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


_logging.getLogger().addFilter(_WithoutGcpExtraNotice())

"""Apache Beam job that converts raw image collections into deterministic, sharded TFRecords.

    import beam_jobs
    info = beam_jobs.convert("photos/", output_dir="tfrecords/", image_size=224)

``convert`` takes the command line's flags as keyword arguments, or a ``ConversionSpec`` (the
one typed description of a conversion that the command line builds too). ``ConvertImages`` is the
whole job as one Beam transform, for a pipeline of your own (its rows from BigQuery, say). Neither
imports Beam until it is used, so ``import beam_jobs`` stays instant.
"""

from __future__ import annotations

import importlib
import logging as _logging
from typing import TYPE_CHECKING

from beam_jobs.api import convert
from beam_jobs.errors import UsageError

if TYPE_CHECKING:
    from beam_jobs.config import ImageConfig
    from beam_jobs.convert_images import ConvertImages
    from beam_jobs.spec import ConversionSpec, Limits, RunMode, ShardSpec, Source, SplitSpec

__version__ = "0.1.0"
__all__ = [
    "ConversionSpec",
    "ConvertImages",
    "ImageConfig",
    "Limits",
    "RunMode",
    "ShardSpec",
    "Source",
    "SplitSpec",
    "UsageError",
    "__version__",
    "convert",
]


# Imported from their modules when first asked for (PEP 562), as tfdata_readers does:
# ConvertImages imports Beam, ImageConfig and the spec the image modules.
_HOMES = {
    "ConvertImages": "convert_images",
    "ImageConfig": "config",
    **{name: "spec" for name in ("ConversionSpec", "Limits", "RunMode", "ShardSpec", "Source", "SplitSpec")},
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'beam_jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"beam_jobs.{home}"), name)
    globals()[name] = value  # Once imported, an ordinary attribute.
    return value


class _WithoutGcpExtraNotice(_logging.Filter):
    """Beam logs, on import, that apitools is missing whenever the [gcp] extra is not installed.
    It is not a problem for local or S3 data (gs:// without the extra fails with a clear error),
    and it would be the first line of every run."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


_logging.getLogger().addFilter(_WithoutGcpExtraNotice())

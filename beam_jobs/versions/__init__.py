"""A dataset folder's versions: history, reading an older one, rolling back, and collecting garbage.

Also a command line: ``python -m beam_jobs.versions DATA_DIR list | rollback N | gc [--keep K] |
files [--version N] [--split S]``.

Every version's manifest stays in OUT/versions/ (small); its data files stay until ``gc`` drops
the versions outside the retention window. ``gc`` and ``rollback`` take the folder's run lock, so
they never race a conversion writing into the same folder.
"""

from beam_jobs.versions.cli import main, version_table
from beam_jobs.versions.garbage import DEFAULT_KEEP, collect_garbage, garbage
from beam_jobs.versions.manifests import VersionNotFoundError, listed_files, shard_files
from beam_jobs.versions.reading import history, kept_versions, load_version
from beam_jobs.versions.rollbacks import rollback

__all__ = [
    "DEFAULT_KEEP",
    "VersionNotFoundError",
    "collect_garbage",
    "garbage",
    "history",
    "kept_versions",
    "listed_files",
    "load_version",
    "main",
    "rollback",
    "shard_files",
    "version_table",
]

"""The end of a run on the console: a table per split, then where the outputs are."""

from __future__ import annotations

import math

from apache_beam.io.filesystems import FileSystems

from beam_jobs.paths import redact
from beam_jobs.writing.finalize import DATASET_INFO

__all__ = ["format_mib", "next_steps_lines", "outputs_lines", "shard_globs", "split_table"]

_LISTING = "(listing)"


def format_mib(size: int) -> str:
    """Bytes in MiB (2**20), with two significant digits at least: a 4.6 KB shard reads 0.0044, not 0.00."""
    mib = size / 2**20
    if mib >= 10:
        return f"{mib:.1f}"
    if mib >= 0.01 or size == 0:
        return f"{mib:.2f}"
    return f"{mib:.{1 - math.floor(math.log10(mib))}f}"


def _reasons(by_reason: dict[str, int]) -> str:
    total = sum(by_reason.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{reason}: {n}" for reason, n in sorted(by_reason.items())) + ")"


def split_table(info: dict) -> str:
    """Examples, shards, MiB and dead letters by reason per split, from dataset_info.json. Pure.

    Dead letters of the listing and planning (bad rows, duplicates) have no split: they get a
    row of their own, so the column adds up to the manifest's num_dead_letters.
    """
    rows = [("split", "examples", "shards", "MiB", "dead letters")]
    assigned: dict[str, int] = {}
    totals = [0, 0, 0]
    for name, split in info["splits"].items():
        size = sum(shard["bytes"] for shard in split["shards"])
        by_reason = split.get("dead_letters_by_reason", {})
        for reason, n in by_reason.items():
            assigned[reason] = assigned.get(reason, 0) + n
        rows.append((name, str(split["num_examples"]), str(split["num_shards"]), format_mib(size), _reasons(by_reason)))
        totals = [totals[0] + split["num_examples"], totals[1] + split["num_shards"], totals[2] + size]
    unassigned = {
        reason: n - assigned.get(reason, 0)
        for reason, n in info.get("dead_letters_by_reason", {}).items()
        if n > assigned.get(reason, 0)
    }
    if unassigned:
        rows.append((_LISTING, "", "", "", _reasons(unassigned)))
    rows.append(
        (
            "total",
            str(totals[0]),
            str(totals[1]),
            format_mib(totals[2]),
            str(info.get("num_dead_letters", sum(assigned.values()) + sum(unassigned.values()))),
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in (1, 2, 3)] + [row[4]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def shard_globs(info: dict, split: str) -> list[str]:
    """Globs, relative to the output folder, that match exactly one split's shards in a version:
    one per run folder its shards lie in (one for a fresh run, one more per append), with the
    usual ``train-*-of-00004.tfrecord`` names. Pure."""
    folders: dict[str, set[str]] = {}
    for shard in info["splits"][split]["shards"]:
        folder, _, name = shard["file"].rpartition("/")
        folders.setdefault(folder, set()).add(name.rsplit("-of-", 1)[-1])
    return [
        f"{folder + '/' if folder else ''}{split}-*-of-{total}"
        for folder, totals in folders.items()
        for total in sorted(totals)
    ]


def outputs_lines(info: dict, output_dir: str) -> list[str]:
    """Where everything went: the shards' pattern per split, the manifest, the dead letters."""
    where = redact(output_dir)
    version = info.get("version")
    lines: list[str] = []
    for name in info["splits"]:
        lines.extend(f"  {FileSystems.join(where, glob)}" for glob in shard_globs(info, name))
    lines.append(f"  {FileSystems.join(where, DATASET_INFO)}" + (f" (version {version})" if version else ""))
    lines.append(f"  {FileSystems.join(where, info['dead_letters_file'])}")
    return lines


def next_steps_lines(info: dict, output_dir: str) -> list[str]:
    """What a user does with a finished dataset: check it, then read it (the train split when
    there is one). Pure."""
    where = redact(output_dir)
    split = "train" if "train" in info["splits"] else next(iter(info["splits"]), "train")
    return [
        f"next: verify-tfrecords {where}",
        f'      tfdata_readers.make_dataset("{where}", "{split}", batch_size=32, training=True)  # in Python',
    ]

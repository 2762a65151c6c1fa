"""Finalising a run: dataset_info.json and dead_letters.jsonl, each written atomically."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence

from apache_beam.io.filesystems import FileSystems

import beam_jobs
from beam_jobs.config import ImageConfig
from beam_jobs.convert import staged_name
from beam_jobs.example import FEATURE_DTYPES
from beam_jobs.plan import DatasetPlan
from beam_jobs.records import DeadLetter, ShardResult
from beam_jobs.storage import write_atomically

__all__ = [
    "DATASET_INFO",
    "DEAD_LETTERS_FILE",
    "SCHEMA_VERSION",
    "TooManyBadInputsError",
    "build_dataset_info",
    "check_bad_fraction",
    "commit_shards",
    "content_duplicate_groups",
    "remove_leftovers",
    "run_fingerprint",
]

DATASET_INFO = "dataset_info.json"
DEAD_LETTERS_FILE = "dead_letters.jsonl"
SCHEMA_VERSION = 1
PRODUCER = "images-to-tfrecords"


class TooManyBadInputsError(RuntimeError):
    """More inputs were unusable than --max_bad_fraction allows."""


def run_fingerprint(config: ImageConfig, settings: dict) -> str:
    """Identifies a run's output-shaping settings: two runs with equal fingerprints write the same
    dataset from the same inputs, so their files may be reused (--resume) but never mixed otherwise."""
    text = json.dumps({"config": config.to_json(), "settings": settings, "schema": SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def content_duplicate_groups(keys_by_sha: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> list[dict]:
    """Groups of written examples with identical source bytes, for the report in dataset_info.json."""
    groups = []
    for sha256, members in keys_by_sha:
        members = sorted(members)
        if len(members) > 1:
            labels = sorted({label for _, label in members})
            groups.append({"sha256": sha256, "files": [f for f, _ in members], "labels": labels,
                           "conflicting_labels": len(labels) > 1})
    return sorted(groups, key=lambda g: g["files"])


def build_dataset_info(
    plan: DatasetPlan,
    results: Iterable[ShardResult],
    *,
    num_dead_letters: int,
    config: ImageConfig,
    settings: dict,
    content_duplicates: Sequence[dict] = (),
) -> dict:
    """The manifest, as a plain dict: pure, so that its content is testable and deterministic."""
    by_split: dict[str, list[ShardResult]] = {}
    for result in sorted(results):
        by_split.setdefault(result.split, []).append(result)
    splits = {}
    for split, shards in sorted(by_split.items()):
        splits[split] = {
            "num_examples": sum(s.num_examples for s in shards),
            "num_shards": len(shards),
            "shards": [
                {"file": s.file, "num_examples": s.num_examples, "bytes": s.bytes, "sha256": s.sha256}
                for s in shards
            ],
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "producer": {"name": PRODUCER, "version": beam_jobs.__version__},
        "label_names": list(plan.label_names),
        "num_classes": len(plan.label_names),
        "image": {
            "height": config.height,
            "width": config.width,
            "channels": config.channels,
            "format": config.format_name,
        },
        "features": {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURE_DTYPES.items()},
        "preprocessing": {**config.to_json(), **settings},
        "splits": splits,
        "num_inputs": plan.num_inputs,
        "num_dead_letters": num_dead_letters,
        "dead_letters_file": DEAD_LETTERS_FILE,
        "fingerprint": run_fingerprint(config, settings),
        # Examples whose source bytes are identical (kept: --dedup=path); --dedup=content drops them.
        "content_duplicates": list(content_duplicates),
    }


def check_bad_fraction(*, num_dead: int, num_inputs: int, max_bad_fraction: float, dead_letters_uri: str) -> None:
    if num_inputs and num_dead / num_inputs > max_bad_fraction:
        raise TooManyBadInputsError(
            f"{num_dead} of {num_inputs} inputs ({num_dead / num_inputs:.1%}) could not be used, more than "
            f"--max_bad_fraction={max_bad_fraction}; no dataset_info.json was written. "
            f"See {dead_letters_uri} for each file and the reason."
        )


def dead_letters_jsonl(dead_letters: Sequence[DeadLetter]) -> bytes:
    """One JSON object per line, sorted, so the file is identical on every run and runner."""
    lines = [json.dumps(d.to_json(), ensure_ascii=False, sort_keys=True) for d in sorted(dead_letters)]
    return "".join(line + "\n" for line in lines).encode("utf-8")


_LEFTOVER = re.compile(r"^(\.tmp-.+|\.staged-.+|.+-\d{5}-of-\d{5}\.tfrecord)$")


def commit_shards(output_dir: str, results: Iterable[ShardResult]) -> None:
    """Gives every staged shard its final name. Idempotent, so a retried finalize is harmless."""
    sources, destinations = [], []
    for result in results:
        staged = FileSystems.join(output_dir, staged_name(result.file))
        final = FileSystems.join(output_dir, result.file)
        if FileSystems.exists(staged):
            sources.append(staged)
            destinations.append(final)
        elif not FileSystems.exists(final):
            raise FileNotFoundError(f"the staged shard {staged} is missing; rerun the job with --resume")
    if sources:
        FileSystems.rename(sources, destinations)


def remove_leftovers(output_dir: str, *, keep: Iterable[str] = ()) -> list[str]:
    """Deletes temp files, shard sidecars and shard files not in ``keep`` (stale shards of an
    interrupted run with another shard count); returns the names deleted."""
    keep = set(keep)
    matches = FileSystems.match([FileSystems.join(output_dir, "*")])[0].metadata_list
    doomed = [m.path for m in matches
              if _LEFTOVER.match(m.path.rsplit("/", 1)[-1]) and m.path.rsplit("/", 1)[-1] not in keep]
    if doomed:
        FileSystems.delete(doomed)
    return sorted(path.rsplit("/", 1)[-1] for path in doomed)


def finalize_outputs(
    results: list[ShardResult],
    plan: DatasetPlan,
    dead_letters: list[DeadLetter],
    content_duplicates: list[dict],
    *,
    output_dir: str,
    config: ImageConfig,
    settings: dict,
    max_bad_fraction: float,
) -> dict:
    """Writes the dead letters, checks the bad fraction, then writes dataset_info.json last.

    When the bad fraction is exceeded, no shard gets its final name; the staged shards and their
    sidecars stay hidden, so a rerun with --resume (after fixing inputs or raising the threshold)
    redoes nothing that was good.
    """
    dead_uri = FileSystems.join(output_dir, DEAD_LETTERS_FILE)
    write_atomically(dead_uri, dead_letters_jsonl(dead_letters))
    check_bad_fraction(
        num_dead=len(dead_letters), num_inputs=plan.num_inputs,
        max_bad_fraction=max_bad_fraction, dead_letters_uri=dead_uri,
    )
    info = build_dataset_info(plan, results, num_dead_letters=len(dead_letters), config=config,
                              settings=settings, content_duplicates=sorted(content_duplicates, key=lambda g: g["files"]))
    commit_shards(output_dir, results)
    remove_leftovers(output_dir, keep=[r.file for r in results])
    text = json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_atomically(FileSystems.join(output_dir, DATASET_INFO), text.encode("utf-8"))
    return info

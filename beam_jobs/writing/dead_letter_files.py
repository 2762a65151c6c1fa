"""The dead-letter files: dead_letters.jsonl's lines, and the sorted parts it is concatenated from."""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from beam_jobs.records import DeadLetter
from beam_jobs.storage import write_atomically

__all__ = [
    "DEAD_LETTERS_FILE",
    "DEAD_LETTER_PARTS",
    "REFUSED_DEAD_LETTERS_FILE",
    "dead_letter_part",
    "dead_letters_jsonl",
    "part_file_name",
    "write_dead_letter_part",
]

DEAD_LETTERS_FILE = "dead_letters.jsonl"
# Where a refused run's dead letters go when the folder still holds a dataset that they would
# otherwise contradict (--overwrite keeps the old dataset whole until a run succeeds).
REFUSED_DEAD_LETTERS_FILE = "dead_letters.refused_run.jsonl"


def dead_letters_jsonl(dead_letters: Iterable[DeadLetter]) -> bytes:
    """One JSON object per line, sorted, so the file is identical on every run and runner."""
    lines = [json.dumps(d.to_json(), ensure_ascii=False, sort_keys=True) for d in sorted(dead_letters)]
    return "".join(line + "\n" for line in lines).encode("utf-8")


# Dead letters are written in this many parts, each sorted, and concatenated in part order: no
# step holds them all (a web-scale input list can have millions of bad rows).
DEAD_LETTER_PARTS = 64


def dead_letter_part(letter: DeadLetter) -> int:
    """The part a dead letter is written in: a stable hash, the same on every runner."""
    digest = hashlib.sha256("\0".join((letter.uri, letter.stage, letter.reason, letter.detail)).encode("utf-8"))
    return int.from_bytes(digest.digest()[:4], "big") % DEAD_LETTER_PARTS


def part_file_name(part: int, prefix: str = "dead_letters") -> str:
    """A part's hidden name: staged, so a listing of the folder never takes it for a result."""
    return f".staged-{prefix}-{part:05d}-of-{DEAD_LETTER_PARTS:05d}.jsonl"


def write_dead_letter_part(
    group: tuple[int, Iterable[DeadLetter]], *, output_dir: str, prefix: str = "dead_letters"
) -> dict:
    """Writes one part (sorted) under a hidden name; returns its small facts for finalize."""
    part, letters = group
    letters = sorted(letters)
    write_atomically(FileSystems.join(output_dir, part_file_name(part, prefix)), dead_letters_jsonl(letters))
    return {
        "part": part,
        "count": len(letters),
        "by_reason": dict(collections.Counter(letter.reason for letter in letters)),
    }

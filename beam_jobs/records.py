"""The small, picklable records that flow between the job's stages (paths and stats, never pixels)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from beam_jobs.paths import redact

__all__ = ["DeadLetter", "InputFile", "ShardResult"]


@dataclass(frozen=True, order=True)
class InputFile:
    """One listed input.

    ``filename`` is the path relative to the input root ("cat/001.jpg"); it names the input in the
    output, and its hash decides the split (when none is given) and the shard. ``label`` and
    ``split`` are None until known. ``size`` and ``mtime`` (seconds) are None when the listing
    did not tell them.
    """

    filename: str
    uri: str
    label: str | None = None
    split: str | None = None
    size: int | None = None
    label_id: int = -1
    content_sha256: str | None = None
    mtime: float | None = None
    origin: str | None = None  # where an input list named it ("list.csv:12"), for messages


@dataclass(frozen=True, order=True)
class DeadLetter:
    """An input the job could not use: one line of dead_letters.jsonl."""

    uri: str
    stage: str
    reason: str
    detail: str = ""

    def to_json(self) -> dict:
        """The dead-letter line, with secrets (signed-URL query strings, passwords) removed."""
        return {key: redact(value) for key, value in asdict(self).items()}


@dataclass(frozen=True, order=True)
class ShardResult:
    """What one written shard holds, for dataset_info.json.

    ``class_counts`` and ``dead_letters_by_reason`` are sorted (name, count) pairs: the per-split
    class histogram and dead-letter table are sums of these, so no step re-reads the shards.
    """

    split: str
    index: int
    num_shards: int
    file: str
    num_examples: int
    bytes: int
    sha256: str
    class_counts: tuple[tuple[str, int], ...] = ()
    dead_letters_by_reason: tuple[tuple[str, int], ...] = ()

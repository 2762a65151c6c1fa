"""Exactly-once audits, by example key, of what an input pipeline (distributed or not) delivered over epochs."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

import tensorflow as tf

__all__ = ["EpochAudit", "audit_epoch", "audit_epochs", "epoch_keys"]


@dataclasses.dataclass(frozen=True)
class EpochAudit:
    """What one epoch delivered, compared with the keys of the split (as a multiset).

    Attributes:
      seen: examples delivered, each delivery counted.
      duplicates: {key: times delivered} for keys delivered more often than the split holds them.
      missing: keys of the split not delivered (repeated if the split holds a key more than once).
      unknown: delivered keys the split does not hold.
      problems: one line per broken rule of the epoch; empty when the epoch is correct.
    """

    seen: int
    duplicates: dict[str, int]
    missing: tuple[str, ...]
    unknown: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether the epoch broke none of the rules: what a test or a distributed check asserts."""
        return not self.problems


def audit_epoch(seen: Sequence[str], expected: Iterable[str], *, max_missing: int = 0) -> EpochAudit:
    """Checks one epoch: no key more often than the split holds it, no unknown key, at most
    `max_missing` examples missing.

    Evaluation must deliver every example exactly once (`max_missing=0`); training that drops the
    last partial global batch may miss up to `global_batch_size - 1`.
    """
    if max_missing < 0:
        raise ValueError(f"max_missing must be >= 0 (got {max_missing!r})")
    want = collections.Counter(expected)
    got = collections.Counter(seen)
    duplicates = {k: n for k, n in sorted(got.items()) if k in want and n > want[k]}
    unknown = tuple(sorted(k for k in got if k not in want))
    missing = tuple(sorted((want - got).elements()))
    problems = []
    if duplicates:
        key, times = next(iter(duplicates.items()))
        extra = sum(n - want[k] for k, n in duplicates.items())
        problems.append(f"{extra} duplicate deliveries of {len(duplicates)} key(s), e.g. {key!r} {times} times")
    if unknown:
        problems.append(f"{len(unknown)} key(s) not in the split, e.g. {unknown[0]!r}")
    if len(missing) > max_missing:
        problems.append(
            f"{len(missing)} of {sum(want.values())} examples missing (at most {max_missing} allowed), "
            f"e.g. {missing[0]!r}"
        )
    return EpochAudit(len(seen), duplicates, missing, unknown, tuple(problems))


def audit_epochs(
    epochs: Sequence[Sequence[str]], expected: Iterable[str], *, training: bool, global_batch_size: int
) -> list[str]:
    """Every broken rule of a run of epochs, each line starting "epoch N:"; [] when the run is correct.

    Evaluation: every epoch delivers every example exactly once. Training: no duplicates and no
    unknown keys, at most `global_batch_size - 1` examples dropped per epoch, and each epoch in a
    different order from the one before (records are reshuffled every epoch).
    """
    expected = list(expected)
    max_missing = global_batch_size - 1 if training else 0
    problems = []
    for number, keys in enumerate(epochs, start=1):
        problems += [f"epoch {number}: {p}" for p in audit_epoch(keys, expected, max_missing=max_missing).problems]
    if training:
        for number in range(1, len(epochs)):
            if list(epochs[number]) == list(epochs[number - 1]):
                problems.append(f"epoch {number + 1}: same order as epoch {number} (not reshuffled)")
    return problems


def epoch_keys(
    dataset: tf.data.Dataset | tf.distribute.DistributedDataset,
    *,
    strategy: tf.distribute.Strategy | None = None,
    key: str = "key",
) -> list[str]:
    """The `key` metadata of every example one pass over `dataset` delivers, in delivery order.

    Each element is a metadata dict, or a tuple whose last item is one (`with_metadata=True`).
    With `strategy`, `dataset` is distributed and every replica's share of a step is collected.
    """
    keys: list[str] = []
    for element in dataset:
        meta = element if isinstance(element, dict) else element[-1]
        values = strategy.experimental_local_results(meta[key]) if strategy else (meta[key],)
        for local in values:
            keys += [k.decode() for k in local.numpy()]
    return keys

"""Refusing a run with too many unusable inputs: the check, and a message that says what to fix."""

from __future__ import annotations

import math

from beam_jobs.errors import Reason

__all__ = [
    "DROPPED_REASONS",
    "TooManyBadInputsError",
    "accepting_fraction",
    "check_bad_fraction",
    "refusal_hint",
]

# Inputs dropped on purpose as copies of another (--dedup): reported, but not unusable.
DROPPED_REASONS = frozenset({Reason.DUPLICATE_INPUT, Reason.DUPLICATE_CONTENT})


class TooManyBadInputsError(RuntimeError):
    """More inputs were unusable than --max_bad_fraction allows."""


# What to do about the reasons that can refuse a whole run by themselves (a layout or a policy,
# not a broken file): said on the console, since few open dead_letters.jsonl before retrying.
_REASON_FIXES = {
    Reason.OUTSIDE_INPUT_ROOT: (
        "entries outside the input list's folder (or symlinks out of the tree) are "
        "refused: pass --allow_outside_root to accept them"
    ),
    Reason.UNEXPECTED_LAYOUT: (
        "images must sit in one folder per class (ROOT/<label>/<image>, or "
        "ROOT/<split>/<label>/<image>): put them in class folders, or give a CSV "
        "or JSONL list with --manifest"
    ),
}


def refusal_hint(by_reason: dict[str, int]) -> str:
    """The main reasons of a refusal (the three commonest), and the fix for those that have one."""
    if not by_reason:
        return ""
    ranked = sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))
    text = "main reasons: " + ", ".join(f"{reason} {count}" for reason, count in ranked[:3])
    fixes = [_REASON_FIXES[reason] for reason, _ in ranked[:3] if reason in _REASON_FIXES]
    return text + "".join(f"; {fix}" for fix in fixes)


def check_bad_fraction(
    *,
    num_dead: int,
    num_inputs: int,
    max_bad_fraction: float,
    dead_letters_uri: str,
    kept_message: str = "no dataset_info.json was written",
    by_reason: dict[str, int] | None = None,
) -> None:
    """``num_dead`` counts unusable inputs only, ``num_inputs`` the inputs that were not dropped as
    copies: --dedup content drops copies on purpose, and they must not fail the job."""
    if num_inputs and num_dead / num_inputs > max_bad_fraction:
        hint = refusal_hint(by_reason or {})
        raise TooManyBadInputsError(
            f"{num_dead} of {num_inputs} inputs ({num_dead / num_inputs:.1%}) could not be used, more than "
            f"--max_bad_fraction={max_bad_fraction}" + (f" ({hint})" if hint else "") + f"; {kept_message}. "
            f"See {dead_letters_uri} for each file and the reason: "
            + (
                # No fraction accepts a dataset of no examples (finalize_outputs refuses it).
                "fix or replace those files; no --max_bad_fraction accepts a run in which no input is usable."
                if num_dead >= num_inputs
                else f"fix or remove those files, or accept them by rerunning with "
                f"--max_bad_fraction={accepting_fraction(num_dead, num_inputs)}."
            )
        )


def accepting_fraction(num_dead: int, num_inputs: int) -> float:
    """The smallest --max_bad_fraction of two decimals that lets ``num_dead`` of ``num_inputs``
    pass (the check refuses only a fraction above it). Pure."""
    return min(1.0, math.ceil(num_dead / num_inputs * 100 - 1e-9) / 100)

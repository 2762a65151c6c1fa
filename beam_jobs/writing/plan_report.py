"""The plan as the user sees it before a long run: its console line and warnings, and --plan_only's
plan.json and plan_dead_letters.jsonl."""

from __future__ import annotations

import collections
import json

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import beam_jobs
from beam_jobs.storage import concatenate_atomically, delete_exactly, write_atomically
from beam_jobs.writing.bad_inputs import DROPPED_REASONS, refusal_hint
from beam_jobs.writing.dataset_info import PRODUCER, applied_settings
from beam_jobs.writing.dead_letter_files import part_file_name

__all__ = [
    "PLAN_DEAD_LETTERS_FILE",
    "PLAN_FILE",
    "is_own_plan",
    "plan_line",
    "plan_warning_lines",
    "write_plan",
]

PLAN_FILE = "plan.json"
PLAN_DEAD_LETTERS_FILE = "plan_dead_letters.jsonl"


def is_own_plan(path: str) -> bool:
    """True when ``path`` is a plan.json this job wrote (--plan_only), which a later run may replace
    or remove; a user's own plan.json (anything else under that common name) is never touched.

    Plans name their producer; older ones are known by their shape (``would_fail`` and a
    ``dead_letters.file`` of plan_dead_letters.jsonl).
    """
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            plan = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(plan, dict):
        return False
    producer, dead = plan.get("producer"), plan.get("dead_letters")
    if isinstance(producer, dict):
        return producer.get("name") == PRODUCER
    return "would_fail" in plan and isinstance(dead, dict) and dead.get("file") == PLAN_DEAD_LETTERS_FILE


def _kept_changes(append: dict) -> str:
    """--changed_sources keep: the held sources whose bytes, label or annotations changed (or that
    are gone), whose examples stay as the version made them; said in the plan line, because an
    append that finds nothing new commits nothing and so writes no warning anywhere else."""
    changed, removed = append.get("changed", 0), append.get("removed", 0)
    if not (changed or removed):
        return ""
    examples = [*append.get("changed_examples", []), *append.get("removed_examples", [])][:3]
    return (
        f"; {changed} changed and {removed} no longer listed source(s) keep the examples the version made "
        f"(--changed_sources keep" + (f", e.g. {', '.join(examples)}" if examples else "") + ")"
    )


def plan_line(summary: dict, by_reason: dict[str, int]) -> str:
    """The plan in one line, in the Keras style: what a user checks before a long run."""
    splits = summary["splits"]
    total = sum(s["num_examples"] for s in splits.values())
    shown = (
        ", ".join(
            f"{name} {s['num_examples']} ({s['num_shards']} shard{'s' if s['num_shards'] != 1 else ''})"
            for name, s in splits.items()
        )
        or "no split"
    )
    ignored = sum(by_reason.values())
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items()))
    # Said only when some were not used: "0 listed files not used" on every run is noise.
    unused = f"; {ignored} listed file{'s' if ignored != 1 else ''} not used ({reasons})" if ignored else ""
    # The classes these images belong to: not a retired label, nor (appending) the version's others.
    with_images = {label for s in splits.values() for label, n in (s.get("class_counts") or {}).items() if n}
    classes = len(with_images) or len(summary["label_names"])
    append = summary.get("append")
    if append is not None:  # --append: what is new, beside what the current version holds
        held = append.get("held", 0) + append.get("changed", 0)
        kept = _kept_changes(append)
        if not total:
            return (
                f"Found no new images: the {held} listed {'is' if held == 1 else 'are'} in the current version"
                f"{kept}{unused}"
            )
        return (
            f"Found {total} new image{'s' if total != 1 else ''} ({held} already in the current version{kept}) "
            f"belonging to {classes} class{'es' if classes != 1 else ''}: {shown}{unused}"
        )
    return (
        f"Found {total} image{'s' if total != 1 else ''} belonging to {classes} class{'es' if classes != 1 else ''}"
        f": {shown}{unused}"
    )


def plan_warning_lines(summary: dict) -> list[str]:
    """The plan's warnings, one a line, to print under the plan line: where a user looks before a
    long run (a changed label map, a class missing from a split, merged split folders, --splits that
    did nothing)."""
    # A plan's own line, or the committed manifest's record of it (repeated under the final table).
    line = summary.get("label_ids_changed") or (summary.get("change") or {}).get("label_ids")
    label_ids = [line] if line else []
    return [f"WARNING: {warning}" for warning in [*label_ids, *summary.get("warnings", [])]]


def write_plan(
    summary: dict, dead_parts: list[dict], *, output_dir: str, settings: dict, max_bad_fraction: float = 1.0
) -> dict:
    """--plan_only: plan.json (counts per split, shard counts, per-class counts per split, the
    listing's dead letters by reason) and plan_dead_letters.jsonl, each written atomically.
    ``would_fail`` says why the full run would fail already from the listing (or is None)."""
    parts = sorted(dead_parts, key=lambda p: p["part"])
    by_reason: collections.Counter[str] = collections.Counter()
    for part in parts:
        by_reason.update(part["by_reason"])
    concatenate_atomically(
        FileSystems.join(output_dir, PLAN_DEAD_LETTERS_FILE),
        [FileSystems.join(output_dir, part_file_name(p["part"], "plan_dead_letters")) for p in parts],
    )
    planned = sum(split["num_examples"] for split in summary["splits"].values())
    unusable = sum(count for reason, count in by_reason.items() if reason not in DROPPED_REASONS)
    considered = summary["num_inputs"] - (sum(by_reason.values()) - unusable)
    verdict = None
    if planned == 0:
        verdict = "no input can become an example"
    elif considered and unusable / considered > max_bad_fraction:
        verdict = (
            f"{unusable} of {considered} inputs are refused already by the listing, more than "
            f"--max_bad_fraction={max_bad_fraction}: the full run would fail"
        )
    if verdict and (hint := refusal_hint(dict(by_reason))):
        verdict += f" ({hint})"  # the fix the full run's refusal gives (a flat folder: class folders)
    plan = {
        **summary,
        "producer": {"name": PRODUCER, "version": beam_jobs.__version__},
        "settings": applied_settings(settings, summary),
        "would_fail": verdict,
        "dead_letters": {
            "count": sum(by_reason.values()),
            "by_reason": dict(sorted(by_reason.items())),
            "file": PLAN_DEAD_LETTERS_FILE,
        },
    }
    write_atomically(
        FileSystems.join(output_dir, PLAN_FILE),
        (json.dumps(plan, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"),
    )
    delete_exactly([FileSystems.join(output_dir, part_file_name(p["part"], "plan_dead_letters")) for p in parts])
    return {**plan, "line": plan_line(summary, dict(by_reason))}

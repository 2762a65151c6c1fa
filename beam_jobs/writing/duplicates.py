"""Examples with identical source bytes: grouped for dataset_info.json's ``content_duplicates``,
and the one warning when such a group carries more than one label. Pure; dataset_info.py (a run's
own examples) and append.py (an append's, merged with the version's) both use it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from beam_jobs.writing.commit import DATASET_INFO

__all__ = ["conflicting_label_warnings", "content_duplicate_groups"]


def content_duplicate_groups(keys_by_sha: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> list[dict]:
    """Groups of written examples with identical source bytes, for the report in dataset_info.json."""
    groups = []
    for sha256, members in keys_by_sha:
        members = sorted(members)
        if len(members) > 1:
            labels = sorted({label for _, label in members})
            groups.append(
                {
                    "sha256": sha256,
                    "files": [f for f, _ in members],
                    "labels": labels,
                    "conflicting_labels": len(labels) > 1,
                }
            )
    return sorted(groups, key=lambda g: g["files"])


def conflicting_label_warnings(content_duplicates: Sequence[dict], *, shown: int = 3) -> list[str]:
    """One warning when identical images carry different labels (a class folder symlinked into
    the tree, a file linked or copied into another class): the model is then taught both labels
    for one image, a wrong dataset that nothing else reports. Names a few groups, counts all."""
    conflicting = [group for group in content_duplicates if group.get("conflicting_labels")]
    if not conflicting:
        return []
    examples = "; ".join(
        f"{' = '.join(map(repr, group['files']))} (labels {', '.join(group['labels'])})"
        for group in conflicting[:shown]
    )
    more = f"; and {len(conflicting) - shown} more" if len(conflicting) > shown else ""
    groups = "image" if len(conflicting) == 1 else "images"
    return [
        f"{len(conflicting)} {groups} with identical content {'carries' if len(conflicting) == 1 else 'carry'} "
        f"more than one label: {examples}{more} "
        "(a symlinked class folder, or a file linked or copied into another class?); see "
        f"content_duplicates in {DATASET_INFO} (--dedup content makes them dead letters instead)"
    ]

"""Label ids across versions, pure: which names keep which ids, and what a version's map changes."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

# --relabel: keep = every later version of an output folder keeps its labels' ids (the default);
# sorted = this version numbers its labels as a first version would, by their sorted names.
RELABEL_CHOICES = ("keep", "sorted")


def ordered_label_names(present: Iterable[str], *, lineage: Sequence[str] = ()) -> tuple[str, ...]:
    """The label names in id order: the ``lineage``'s first, each at its id (those no input has any
    more included, so that a removed label's id is never given to another), then the new ones,
    sorted. A first version has no lineage: its ids are the sorted names, as Keras numbers a
    tree's folders."""
    known = tuple(lineage)
    return known + tuple(sorted(set(present) - set(known)))


def label_lineage(chain: Sequence[Mapping]) -> tuple[str, ...]:
    """The label names, in id order, whose ids the next version of an output folder keeps, from its
    manifests newest first (the current one first): the current version's label_names, then the
    names an earlier version gave later ids that a rollback left out, so that those ids are never
    given to other labels.

    A version numbered otherwise (one before a --relabel sorted, or a rollback across one) ends
    the walk: its ids belong to another numbering. Pure."""
    if not chain:
        return ()
    lineage = list(chain[0].get("label_names") or [])
    for manifest in chain[1:]:
        names = list(manifest.get("label_names") or [])
        shared = min(len(names), len(lineage))
        if names[:shared] != lineage[:shared]:
            break
        lineage += names[len(lineage) :]
    return tuple(lineage)


def label_id_changes(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """What the map ``after`` does to the labels of ``before``, in name order: "'aaa' 2 -> 0" for
    a label given another id, "'aaa' (id 2) is dropped" for one ``after`` does not hold. Pure."""
    old = {name: index for index, name in enumerate(before)}
    new = {name: index for index, name in enumerate(after)}
    return [
        f"{name!r} (id {old[name]}) is dropped" if name not in new else f"{name!r} {old[name]} -> {new[name]}"
        for name in sorted(old)
        if new.get(name) != old[name]
    ]


def _labels_with_ids(names: Sequence[str], ids: Mapping[str, int], *, limit: int = 10) -> str:
    shown = ", ".join(f"{name!r} (id {ids[name]})" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _label_map_line(
    before: Sequence[str],
    after: Sequence[str],
    *,
    retired_before: Collection[str],
    retired: Sequence[str],
    relabel: str,
) -> str | None:
    """One line saying what a version's label map changes against the current version's, or None."""
    ids = {name: index for index, name in enumerate(after)}
    new = [name for name in after if name not in before and name not in retired]
    newly_retired = [name for name in retired if name not in retired_before]
    back = [name for name in after if name in retired_before and name not in retired]
    parts = []
    if len(new) == 1:
        parts.append(f"{new[0]!r} is new with id {ids[new[0]]}")
    elif new:
        parts.append(f"{_labels_with_ids(new, ids)} are new")
    if len(newly_retired) == 1:
        parts.append(
            f"{_labels_with_ids(newly_retired, ids)} is retired: no input has it, and no other label will take its id"
        )
    elif newly_retired:
        parts.append(
            f"{_labels_with_ids(newly_retired, ids)} are retired: no input has them, and no other label will "
            "take their ids"
        )
    if back:
        parts.append(f"{_labels_with_ids(back, ids)} {'is' if len(back) == 1 else 'are'} back")
    if relabel == "sorted":
        renumbered = label_id_changes(before, after)
        if renumbered:
            return "; ".join([f"label ids renumbered by --relabel sorted: {', '.join(renumbered)}", *parts])
        parts.insert(0, "--relabel sorted renumbered none (they follow the sorted names already)")
    return "label ids: " + "; ".join(parts) if parts else None


def with_label_map(
    summary: Mapping, *, before: Sequence[str], retired_before: Collection[str], relabel: str, appending: bool
) -> dict:
    """The plan's summary, with what its label map means against the current version's (``before``,
    in id order, of which ``retired_before`` are retired; () when there is none). Pure.

    A removed label stays in label_names, at its id, with zero counts: every id a reader of any
    version sees is still an index of label_names, and no other label takes it. Adds
    ``retired_labels``, those names (absent when none), and ``label_ids_changed``, one line that
    says what changed (absent when nothing did, and for a first version). An append's inputs need
    not show every class the version holds: only those retired already stay retired."""
    after = list(summary["label_names"])
    present = {
        name
        for facts in summary.get("splits", {}).values()
        for name, count in facts.get("class_counts", {}).items()
        if count
    }
    retired = [
        name
        for name in after
        if name not in present and (not appending or name in retired_before or name not in before)
    ]
    mapped = {key: value for key, value in summary.items() if key not in ("retired_labels", "label_ids_changed")}
    if retired:
        mapped["retired_labels"] = retired
    line = (
        _label_map_line(before, after, retired_before=set(retired_before), retired=retired, relabel=relabel)
        if before
        else None
    )
    if line is not None:
        mapped["label_ids_changed"] = line
    return mapped

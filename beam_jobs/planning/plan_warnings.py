"""The plan's warnings, pure: classes missing from a split, splits no input took, labels out of numeric order."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence

# How a requested split that no input went to ends its warning; with split groups, the plan's
# report names the largest group in its place (transforms._with_group_cause).
TOO_FEW_FOR_FRACTION = "(too few inputs for its fraction)"


def _shown(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


_DECIMAL = re.compile(r"[0-9]+")


def _first_label_out_of_numeric_order(label_names: Sequence[str]) -> str | None:
    """The first label whose id (its place in ``label_names``) is not its place in numeric order,
    when every label is a decimal integer ('0', '1', '10', '2': '10'); else None.

    A first version's ids are the positions of the sorted names, as Keras gives them, so a tree
    and a list agree; later versions keep each label's id (ordered_label_names). Nothing is
    renumbered behind the user's back; only the surprise is said."""
    if not label_names or not all(_DECIMAL.fullmatch(label) for label in label_names):
        return None
    numeric = sorted(label_names, key=lambda label: (int(label), label))
    return next((text for text, number in zip(label_names, numeric, strict=True) if text != number), None)


def plan_warnings(
    class_counts: Mapping[str, Mapping[str, int]],
    label_names: Sequence[str],
    *,
    requested: Mapping[str, float] | None,
    num_unsplit: int,
    merged_folders: Mapping[str, Sequence[str]] | None = None,
    retired: Collection[str] | None = None,
) -> list[str]:
    """What a user should know before a long run, from the plan's small facts: split folders
    merged into one split, classes whose names differ only by case, labels that look like numbers
    but whose ids are not in numeric order, --splits that no input took,
    a requested split that received nothing, and classes missing from a split. ``class_counts``
    is {split: {label: count}}.

    A ``retired`` label (one the lineage keeps for its id, but no input has: see with_label_map)
    is missing from every split on purpose, and not reported as missing from each; None: the
    labels no split counts, which at plan time are exactly those."""
    if retired is None:
        retired = {label for label in label_names if not any(counts.get(label) for counts in class_counts.values())}
    warnings = [
        f"the split folders {_shown(list(folders))} are one split {split!r} (split names are lower case)"
        for split, folders in sorted((merged_folders or {}).items())
    ]
    by_folded: dict[str, list[str]] = defaultdict(list)
    for label in label_names:
        by_folded[label.casefold()].append(label)
    # Labels are compared as written (a dataset may mean "US" and "us"), but case twins are
    # more often one class typed twice: said, never merged behind the user's back.
    warnings += [
        f"the classes {_shown(sorted(twins))} differ only by case; they are separate classes"
        for _, twins in sorted(by_folded.items())
        if len(twins) > 1
    ]
    out_of_order = _first_label_out_of_numeric_order(label_names)
    if out_of_order is not None and list(label_names) == sorted(label_names):
        warnings.append(
            f"labels look like numbers but ids follow sorted text order ({out_of_order!r} has id "
            f"{list(label_names).index(out_of_order)}); dataset_info.json's label_names maps ids to "
            "names (Keras does the same); name them 00, 01, ... to keep numeric order"
        )
    elif out_of_order is not None:
        warnings.append(
            f"labels look like numbers but their ids are not in numeric order ({out_of_order!r} has id "
            f"{list(label_names).index(out_of_order)}): each label keeps the id an earlier version gave it "
            "and new labels take the next ones; dataset_info.json's label_names maps ids to names "
            "(--relabel sorted renumbers them in sorted text order)"
        )
    if requested and num_unsplit == 0:
        warnings.append(
            f"--splits {','.join(requested)} was ignored: every input already has a split "
            "(from the tree's split folders or the input list's split column)"
        )
    elif requested:
        warnings += [
            f"--splits asks for {split!r}, but none of the {num_unsplit} inputs without a split went to it "
            + TOO_FEW_FOR_FRACTION
            for split in requested
            if split not in class_counts
        ]
    for split in sorted(class_counts):
        missing = [label for label in label_names if label not in retired and not class_counts[split].get(label)]
        if missing:
            warnings.append(
                f"split {split!r} has no example of {len(missing)} class{'es' if len(missing) != 1 else ''}: "
                f"{_shown(missing)}"
            )
    return warnings

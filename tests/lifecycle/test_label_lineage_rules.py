"""The rules of label ids across a dataset's versions, as pure functions: the first version
sorts the names, later ones keep each label's id, give new labels the next ids and never reuse a
removed label's id; a changed map is said in one line (see test_label_lineage.py for real runs)."""

from __future__ import annotations

from beam_jobs.planning.rules import (
    label_id_changes,
    label_lineage,
    ordered_label_names,
    plan_dataset,
    plan_warnings,
    with_label_map,
)
from beam_jobs.records import InputFile


def test_the_first_version_sorts_and_later_ones_keep_ids_and_add_new_labels_at_the_end():
    assert ordered_label_names(["ccc", "aaa", "bbb"]) == ("aaa", "bbb", "ccc")
    assert ordered_label_names(["ccc", "aaa", "bbb"], lineage=("bbb", "ccc")) == ("bbb", "ccc", "aaa")
    # A label the lineage holds but no input has keeps its place: its id is never reused.
    assert ordered_label_names(["aaa", "ddd"], lineage=("bbb", "ccc", "aaa")) == ("bbb", "ccc", "aaa", "ddd")


def test_the_lineage_is_the_current_manifest_then_ids_a_version_rolled_back_from_gave():
    v1 = {"label_names": ["bbb", "ccc"]}
    v2 = {"label_names": ["bbb", "ccc", "eee"]}  # an append
    v3 = {"label_names": ["bbb", "ccc"]}  # rollback to 1
    assert label_lineage([v3, v2, v1]) == ("bbb", "ccc", "eee")
    # Ids given before a renumbering are another numbering: not this lineage's.
    sorted_v4 = {"label_names": ["aaa", "bbb", "ccc"]}
    before = {"label_names": ["bbb", "ccc", "aaa", "zzz"]}
    assert label_lineage([sorted_v4, before]) == ("aaa", "bbb", "ccc")
    assert label_lineage([]) == ()


def test_a_changed_map_is_said_in_one_line_and_an_unchanged_one_says_nothing():
    summary = {"label_names": ["bbb", "ccc", "aaa"], "splits": {"train": {"class_counts": {"bbb": 2, "aaa": 1}}}}
    mapped = with_label_map(summary, before=("bbb", "ccc"), retired_before=(), relabel="keep", appending=False)
    assert mapped["retired_labels"] == ["ccc"]
    line = mapped["label_ids_changed"]
    assert "'aaa' is new with id 2" in line and "'ccc' (id 1) is retired" in line, line
    assert "\n" not in line
    same = {"label_names": ["bbb", "ccc"], "splits": {"train": {"class_counts": {"bbb": 2, "ccc": 1}}}}
    assert "label_ids_changed" not in with_label_map(
        same, before=("bbb", "ccc"), retired_before=(), relabel="keep", appending=False
    )
    # The first version: nothing to compare with.
    assert "label_ids_changed" not in with_label_map(
        same, before=(), retired_before=(), relabel="keep", appending=False
    )


def test_an_append_retires_nothing_of_what_the_version_holds():
    """An append's own inputs need not show every class the version holds: those stay live."""
    summary = {"label_names": ["bbb", "ccc", "aaa"], "splits": {"train": {"class_counts": {"aaa": 1}}}}
    mapped = with_label_map(summary, before=("bbb", "ccc"), retired_before=(), relabel="keep", appending=True)
    assert "retired_labels" not in mapped
    assert mapped["label_ids_changed"] == "label ids: 'aaa' is new with id 2"
    back = with_label_map(summary, before=("bbb", "ccc"), retired_before=("ccc",), relabel="keep", appending=True)
    assert back["retired_labels"] == ["ccc"]


def test_renumbering_names_each_old_and_new_id():
    assert label_id_changes(("bbb", "ccc", "aaa"), ("aaa", "bbb", "ccc")) == [
        "'aaa' 2 -> 0",
        "'bbb' 0 -> 1",
        "'ccc' 1 -> 2",
    ]
    assert label_id_changes(("bbb", "ccc", "aaa"), ("bbb", "ccc")) == ["'aaa' (id 2) is dropped"]


def test_a_retired_class_is_not_reported_missing_from_each_split():
    counts = {"train": {"aaa": 3, "bbb": 0, "ccc": 2}, "validation": {"aaa": 1, "bbb": 0, "ccc": 0}}
    warnings = plan_warnings(counts, ["aaa", "bbb", "ccc"], requested=None, num_unsplit=0, retired=["bbb"])
    assert warnings == ["split 'validation' has no example of 1 class: 'ccc'"]
    # At plan time a class no input has is the retired one, whatever the caller says.
    planned = plan_warnings(counts, ["aaa", "bbb", "ccc"], requested=None, num_unsplit=0)
    assert planned == ["split 'validation' has no example of 1 class: 'ccc'"]


def test_numbered_labels_kept_out_of_numeric_order_by_the_lineage_say_why():
    warnings = plan_warnings({"train": {"1": 1, "2": 1, "0": 1}}, ["1", "2", "0"], requested=None, num_unsplit=0)
    assert warnings == [
        "labels look like numbers but their ids are not in numeric order ('1' has id 0): each label keeps "
        "the id an earlier version gave it and new labels take the next ones; dataset_info.json's "
        "label_names maps ids to names (--relabel sorted renumbers them in sorted text order)"
    ]


def test_the_in_memory_plan_keeps_the_lineages_ids():
    files = [
        InputFile(f"{label}/{i}.jpg", f"/t/{label}/{i}.jpg", label=label) for label in ("aaa", "bbb") for i in range(2)
    ]
    plan = plan_dataset(files, num_shards=1, example_bytes=1, known_labels=("bbb", "ccc"))
    assert plan.label_names == ("bbb", "ccc", "aaa")
    assert {f.label: f.label_id for shard in plan.shards for f in shard.inputs} == {"bbb": 0, "aaa": 2}
    assert not [w for w in plan.warnings if "has no example of" in w]

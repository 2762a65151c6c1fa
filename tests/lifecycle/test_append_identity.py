"""An input is who it is relative to its root, and what its bytes are: a dataset converted from
one folder and appended to from a copy of it elsewhere (cp -a, cp -r, a touch of every file, a
remount), with the dataset folder moved too, holds every image once; a relabelled image kept by
--changed_sources keep is reported under its two labels; a copy of held bytes under a new name
is not stored again."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

import beam_jobs
from beam_jobs.errors import JobError
from beam_jobs.planning.transforms import PLAN_CHANGES, compare_with_held
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from beam_jobs.writing.append import merge_appended, read_held_inputs
from tests.lifecycle.checks import examples_of_manifest, manifest, verify_clean

CLASSES = ["coffee", "china", "rocket"]
OPTIONS = dict(image_size=24, splits="train=0.8,validation=0.2", num_shards=2)


def _photos(folder: pathlib.Path, num_images: int = 30) -> list[pathlib.Path]:
    return make_photo_tree(folder, num_images=num_images, size=(64, 48), seed=5, classes=CLASSES)


def _one_more_image(folder: pathlib.Path) -> str:
    """A new photo (bytes no other input has) in the folder of the first class: its relative name."""
    [extra] = make_photo_tree(folder / ".new", num_images=1, size=(64, 48), seed=99, classes=CLASSES[:1])
    target = folder / CLASSES[0] / "coffee_new.jpg"
    extra.rename(target)
    shutil.rmtree(folder / ".new")
    return f"{CLASSES[0]}/coffee_new.jpg"


def _copy_preserving_times(source: pathlib.Path, target: pathlib.Path) -> None:  # cp -a
    shutil.copytree(source, target, copy_function=shutil.copy2)


def _copy_with_new_times(source: pathlib.Path, target: pathlib.Path) -> None:  # cp -r, rsync without -t
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for path in target.rglob("*.jpg"):
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 3600))


def _copy_then_touch(source: pathlib.Path, target: pathlib.Path) -> None:  # touch of every file
    shutil.copytree(source, target, copy_function=shutil.copy2)
    for path in target.rglob("*.jpg"):
        os.utime(path, (path.stat().st_atime + 7200, path.stat().st_mtime + 7200))


def _as_an_earlier_release_wrote_its_sidecars(out: pathlib.Path) -> None:
    """Sidecars without the relative names and digests of their inputs: what a dataset converted
    before they were recorded holds (its inputs are named by absolute uri only)."""
    for sidecar in out.glob("shards/*/.*.tfrecord.json"):
        record = json.loads(sidecar.read_text())
        record.pop("input_filenames", None)
        record.pop("input_sha256", None)
        sidecar.write_text(json.dumps(record, sort_keys=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    "copy, older_sidecars",
    [
        (_copy_preserving_times, False),
        (_copy_with_new_times, False),
        (_copy_then_touch, False),
        (_copy_with_new_times, True),
    ],
    ids=["cp-a", "cp-r", "touch", "cp-r-older-sidecars"],
)
def test_a_moved_dataset_appended_from_a_moved_input_folder_holds_every_image_once(tmp_path, copy, older_sidecars):
    photos = tmp_path / "photos"
    _photos(photos)
    first = beam_jobs.convert(str(photos), output_dir=str(tmp_path / "out"), **OPTIONS)
    assert sum(s["num_examples"] for s in first["splits"].values()) == 30
    if older_sidecars:
        _as_an_earlier_release_wrote_its_sidecars(tmp_path / "out")
    # Both folders move: another mount point, another machine.
    moved, out = tmp_path / "elsewhere" / "photos_moved", tmp_path / "elsewhere" / "out_moved"
    copy(photos, moved)
    shutil.rmtree(photos)
    shutil.move(str(tmp_path / "out"), str(out))
    added = _one_more_image(moved)
    second = beam_jobs.convert(str(moved), output_dir=str(out), append=True, **OPTIONS)
    assert second["version"] == 2, second
    examples = examples_of_manifest(out, manifest(out))
    assert sum(examples.values()) == 31 and max(examples.values()) == 1, examples
    assert sorted(name for _, name, _ in examples) == sorted([str(p.relative_to(moved)) for p in moved.rglob("*.jpg")])
    assert added in {name for _, name, _ in examples}
    assert second["content_duplicates"] == [], second["content_duplicates"]
    # No input is kept as "changed" or "removed", and none is reported under two labels.
    assert not [w for w in second["warnings"] if "--changed_sources" in w or "identical content" in w], second
    assert second["num_dead_letters"] == 0, second["dead_letters_by_reason"]
    verify_clean(out)


@pytest.mark.slow
def test_a_relabelled_image_kept_is_reported_under_its_two_labels_never_silently(tmp_path):
    photos = tmp_path / "photos"
    _photos(photos, num_images=12)
    out = tmp_path / "out"
    beam_jobs.convert(str(photos), output_dir=str(out), **OPTIONS)
    (photos / "coffee" / "coffee_00000.jpg").rename(photos / "china" / "coffee_00000.jpg")
    with pytest.raises(Exception, match=r"1 input is no longer listed \(coffee/coffee_00000\.jpg\)") as refused:
        beam_jobs.convert(str(photos), output_dir=str(out), append=True, **OPTIONS)
    assert str(tmp_path) not in str(refused.value) and "changed (" not in str(refused.value), refused.value
    kept = beam_jobs.convert(str(photos), output_dir=str(out), append=True, changed_sources="keep", **OPTIONS)
    assert kept["version"] == 2
    [group] = kept["content_duplicates"]
    assert group["files"] == ["china/coffee_00000.jpg", "coffee/coffee_00000.jpg"], group
    assert group["labels"] == ["china", "coffee"] and group["conflicting_labels"] is True
    [warning] = [w for w in kept["warnings"] if "identical content carries more than one label" in w]
    assert "'china/coffee_00000.jpg' = 'coffee/coffee_00000.jpg'" in warning, warning


@pytest.mark.slow
def test_an_append_does_not_store_again_bytes_the_version_holds_under_the_same_label(tmp_path):
    photos = tmp_path / "photos"
    _photos(photos, num_images=12)
    out = tmp_path / "out"
    beam_jobs.convert(str(photos), output_dir=str(out), **OPTIONS)
    shutil.copy(photos / "coffee" / "coffee_00000.jpg", photos / "coffee" / "same_bytes.jpg")
    added = _one_more_image(photos)
    second = beam_jobs.convert(str(photos), output_dir=str(out), append=True, **OPTIONS)
    examples = examples_of_manifest(out, second)
    assert sum(examples.values()) == 13 and added in {name for _, name, _ in examples}
    assert "coffee/same_bytes.jpg" not in {name for _, name, _ in examples}
    assert second["content_duplicates"] == [] and second["dead_letters_by_reason"] == {"duplicate_content": 1}
    [letter] = [json.loads(line) for line in (out / second["dead_letters_file"]).read_text().splitlines()]
    assert letter["reason"] == "duplicate_content" and "coffee/coffee_00000.jpg" in letter["detail"], letter


def _compare(listed, held, digests):
    outputs = compare_with_held(
        ("a.jpg", {"listed": listed, "held": held}),
        state_of=lambda f: [f.size, f.mtime],
        digests_of=lambda f: digests,
    )
    return [o.value[0] if getattr(o, "tag", None) == PLAN_CHANGES else "new" for o in outputs]


@pytest.mark.parametrize(
    "listed, digests, says",
    [
        (InputFile("a.jpg", "/new/a.jpg", label="cat", size=1, mtime=9.0), ["d1"], ["held"]),  # touched
        (InputFile("a.jpg", "/new/a.jpg", label="cat", size=1, mtime=9.0), ["d2"], ["changed"]),  # rewritten
        (InputFile("a.jpg", "/new/a.jpg", label="cat", size=1, mtime=2.0), ["d2"], ["held"]),  # the hint holds
        (InputFile("a.jpg", "/new/a.jpg", label="dog", size=1, mtime=9.0), ["d1"], ["changed"]),  # relabelled
    ],
    ids=["touched", "rewritten", "same size and time", "relabelled"],
)
def test_size_and_time_are_a_hint_and_only_other_bytes_or_label_are_a_change(listed, digests, says):
    held = {"state": [1, 2.0], "digests": ["d1"], "label": "cat", "split": "train", "uri": "/old/a.jpg"}
    assert _compare([listed], [held], digests) == says


def test_a_held_input_without_a_recorded_digest_is_changed_when_its_time_differs():
    listed = InputFile("a.jpg", "/new/a.jpg", label="cat", size=1, mtime=9.0)
    held = {"state": [1, 2.0], "digests": None, "label": "cat", "split": "train", "uri": "/old/a.jpg"}
    assert _compare([listed], [held], ["d1"]) == ["changed"]


def _sidecar(tmp_path: pathlib.Path, record: dict) -> str:
    (tmp_path / "shards" / "r").mkdir(parents=True)
    (tmp_path / "shards" / "r" / ".train-00000-of-00001.tfrecord.json").write_text(json.dumps(record))
    return "shards/r/.train-00000-of-00001.tfrecord.json"


def test_an_earlier_releases_sidecar_names_its_inputs_relative_to_the_root_its_examples_show(tmp_path):
    """Without input_filenames, the root is what a written input's uri has before its filename,
    and written inputs keep their digests; a dead letter is no example, so it is not held."""
    relative = _sidecar(
        tmp_path,
        {
            "inputs": ["/data/photos/cat/1.jpg", "/data/photos/cat/bad.jpg", "/data/photos/dog/2.jpg"],
            "sources": [[1, 2.0], [3, 4.0], [5, 6.0]],
            "input_labels": ["cat", "cat", "dog"],
            "split": "train",
            "dead_letters": [["/data/photos/cat/bad.jpg", "decode", "decode_error", ""]],
            "content_keys": [["s1", "cat/1.jpg", "cat"], ["s2", "dog/2.jpg", "dog"]],
        },
    )
    held = dict(read_held_inputs(relative, output_dir=str(tmp_path), version=1))
    assert sorted(held) == ["cat/1.jpg", "dog/2.jpg"]
    assert held["cat/1.jpg"]["digests"] == ["s1"] and held["dog/2.jpg"]["digests"] == ["s2"]
    assert all(facts["written"] for facts in held.values())


def test_a_hand_edited_signature_in_a_sidecar_fails_the_append_naming_the_sidecar(tmp_path):
    facts = {
        "inputs": ["/data/photos/cat/1.jpg"],
        "input_filenames": ["cat/1.jpg"],
        "sources": [[1, 2.0]],
        "input_labels": ["cat"],
        "split": "train",
        "content_keys": [["s1", "cat/1.jpg", "cat"]],
    }
    relative = _sidecar(tmp_path / "kept", {**facts, "input_phash": ["00ff" * 9]})
    held = dict(read_held_inputs(relative, output_dir=str(tmp_path / "kept"), version=1))
    assert held["cat/1.jpg"]["phash"] == int("00ff" * 9, 16)
    relative = _sidecar(tmp_path / "edited", {**facts, "input_phash": ["not a signature"]})
    with pytest.raises(JobError, match=r"train-00000-of-00001.tfrecord.json records a signature that is no hex"):
        dict(read_held_inputs(relative, output_dir=str(tmp_path / "edited"), version=1))


def test_an_append_reports_content_duplicates_of_the_whole_version_once_per_content():
    group = {"sha256": "s", "files": ["a/1.jpg", "b/1.jpg"], "labels": ["a", "b"], "conflicting_labels": True}
    base = {
        "label_names": ["a", "b"],
        "num_inputs": 2,
        "warnings": ["1 image with identical content carry more than one label: 'a/1.jpg' = 'b/1.jpg' (labels a, b)"],
        "content_duplicates": [group],
        "splits": {"train": {"num_examples": 2, "class_counts": {"a": 1, "b": 1}, "shards": [{"file": "x"}]}},
    }
    grown = {**group, "files": ["a/1.jpg", "b/1.jpg", "b/2.jpg"]}
    added = {
        "label_names": ["a", "b"],
        "num_inputs": 1,
        "warnings": ["1 image with identical content carry more than one label: 'a/1.jpg' = 'b/1.jpg' = 'b/2.jpg'"],
        "content_duplicates": [grown],
        "splits": {"train": {"num_examples": 1, "class_counts": {"a": 0, "b": 1}, "shards": [{"file": "y"}]}},
    }
    merged = merge_appended(base, added)
    assert merged["content_duplicates"] == [grown]
    [warning] = merged["warnings"]
    assert "'a/1.jpg' = 'b/1.jpg' = 'b/2.jpg' (labels a, b)" in warning, warning


@pytest.mark.slow
def test_an_input_the_version_dead_lettered_is_retried_by_an_append_whether_fixed_or_gone(tmp_path):
    """The usual repair: fix (or delete) the inputs a version could not use, then append. A dead
    letter is no example of the version: never "no longer listed", never "changed"."""

    def examples(info) -> int:
        return sum(split["num_examples"] for split in info["splits"].values())

    for fate in ("fixed", "gone"):
        photos, out = tmp_path / fate / "photos", tmp_path / fate / "out"
        paths = _photos(photos, num_images=12)
        broken = photos / CLASSES[1] / "broken.jpg"
        broken.write_bytes(paths[1].read_bytes()[:200])  # a truncated JPEG: a dead letter
        first = beam_jobs.convert(str(photos), output_dir=str(out), max_bad_fraction=0.5, **OPTIONS)
        assert first["num_dead_letters"] == 1 and examples(first) == 12
        if fate == "fixed":  # a whole photo under the same name: the append converts it
            [fixed] = make_photo_tree(tmp_path / "fix", num_images=1, size=(64, 48), seed=77, classes=CLASSES[1:2])
            broken.write_bytes(fixed.read_bytes())
        else:  # deleted, and a new photo beside: the append adds the new one and refuses nothing
            broken.unlink()
            _one_more_image(photos)
        second = beam_jobs.convert(str(photos), output_dir=str(out), append=True, **OPTIONS)
        assert (second.version, examples(second), second["num_dead_letters"]) == (2, 13, 0), fate
        verify_clean(out)


@pytest.mark.slow
def test_a_new_copy_of_held_bytes_is_its_duplicate_whatever_its_name_sorts_before(tmp_path):
    """With --dedup content, the first name in sorted order wins among new copies only: a copy
    named to sort before the held original must not push the original out of the listing."""
    photos, out = tmp_path / "photos", tmp_path / "out"
    paths = _photos(photos, num_images=9)
    options = {**OPTIONS, "dedup": "content"}
    beam_jobs.convert(str(photos), output_dir=str(out), **options)
    held = paths[0]
    for name in ("aa_copy.jpg", "zz_copy.jpg"):
        (held.parent / name).write_bytes(held.read_bytes())
    info = beam_jobs.convert(str(photos), output_dir=str(out), append=True, **options)
    assert info.version == 1  # nothing new: both copies are the held example's duplicates
    newest = sorted(out.glob("shards/*/dead_letters.jsonl"))[-1]
    letters = [json.loads(line) for line in newest.read_text().splitlines()]
    original = held.relative_to(photos).as_posix()
    assert sorted((pathlib.Path(d["uri"]).name, d["reason"]) for d in letters) == [
        ("aa_copy.jpg", "duplicate_content"),
        ("zz_copy.jpg", "duplicate_content"),
    ]
    assert all(original in d["detail"] for d in letters), letters


def test_an_append_says_again_only_the_warnings_still_true_of_its_own_plan():
    """Groups across splits and a split no new input went to are said by each run of its own plan:
    the version's are not carried into the next version, where they may no longer hold."""
    from beam_jobs.writing.append import _merged_warnings

    stale = [
        "2 group(s) hold inputs whose splits were given (split folders, a split column) or written by an earlier "
        "version, and differ, so each spans two splits: 'a/x.jpg', 'b/y.jpg'",
        "--splits asks for 'test', but none of the 3 inputs without a split went to it (too few inputs for its "
        "fraction)",
    ]
    kept = "a warning about something else"
    now = (
        "--splits asks for 'test', but none of the 1 inputs without a split went to it (too few inputs for its "
        "fraction)"
    )
    splits = {"train": {"class_counts": {"cat": 3}}, "test": {"class_counts": {"cat": 1}}}
    merged = _merged_warnings({"warnings": [*stale, kept]}, {"warnings": [now]}, splits, ["cat"], [])
    assert merged == [kept, now]

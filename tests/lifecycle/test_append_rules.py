"""The rules that decide what an append, a gc and a commit may do, as pure functions and small
local commits, each from a case a user hit: a relabelled input kept silently, a user's folder
under shards/ collected, a hand-restored manifest making a version number reused, warnings of
the new inputs alone stored as the dataset's, a rollback to a version whose dead letters are gone."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from beam_jobs.planning.transforms import PLAN_CHANGES, compare_with_held
from beam_jobs.records import InputFile
from beam_jobs.sample_data import make_photo_tree
from beam_jobs.versions import garbage
from beam_jobs.versions.cli import _files_state
from beam_jobs.versions.manifests import _missing_files
from beam_jobs.writing.append import merge_appended
from beam_jobs.writing.commit import commit_version, read_current
from tests.conftest import REPO

RUN = "20261201T100000Z-0123abcd"


def _compare(listed, held):
    outputs = list(compare_with_held(("u", {"listed": listed, "held": held}), state_of=lambda f: [f.size, f.mtime]))
    return [o.value[0] if getattr(o, "tag", None) == PLAN_CHANGES else "new" for o in outputs]


@pytest.mark.parametrize(
    "listed, says",
    [
        (InputFile("a.jpg", "u", label="cat", split="train", size=1, mtime=2.0), ["held"]),
        (InputFile("a.jpg", "u", label="cat", size=1, mtime=2.0), ["held"]),  # the split is the plan's to give
        (InputFile("a.jpg", "u", label="dog", split="train", size=1, mtime=2.0), ["changed"]),  # relabelled
        (InputFile("a.jpg", "u", label="cat", split="validation", size=1, mtime=2.0), ["changed"]),  # moved
        (InputFile("a.jpg", "u", label="cat", split="train", size=9, mtime=2.0), ["changed"]),  # rewritten
    ],
    ids=["same", "no split listed", "label", "split", "content"],
)
def test_an_input_relabelled_or_moved_is_changed_not_held(listed, says):
    held = {"state": [1, 2.0], "label": "cat", "split": "train"}
    assert _compare([listed], [held]) == says


def test_an_input_no_longer_listed_is_removed_and_a_new_one_is_new():
    assert _compare([], [{"state": [1, 2.0], "label": "cat", "split": "train"}]) == ["removed"]
    assert _compare([InputFile("a.jpg", "u", label="cat", size=1, mtime=2.0)], []) == ["new"]


def _version(version: int, files: list[str], dead: str) -> dict:
    return {
        "version": version,
        "dead_letters_file": dead,
        "splits": {"train": {"shards": [{"file": f, "bytes": 5} for f in files]}},
    }


def test_gc_never_collects_a_users_folder_or_file_under_shards():
    old, new = f"shards/{RUN}", "shards/20261201T110000Z-89abcdef"
    chain = [
        _version(3, [f"{new}/train-00000-of-00001.tfrecord"], f"{new}/dead_letters.jsonl"),
        _version(2, [f"{new}/train-00000-of-00001.tfrecord"], f"{new}/dead_letters.jsonl"),
        _version(1, [f"{old}/train-00000-of-00001.tfrecord"], f"{old}/dead_letters.jsonl"),
    ]
    existing = {
        name: 5
        for name in [
            f"{old}/train-00000-of-00001.tfrecord",
            f"{old}/.train-00000-of-00001.tfrecord.json",
            f"{old}/dead_letters.jsonl",
            f"{new}/train-00000-of-00001.tfrecord",
            f"{new}/dead_letters.jsonl",
            "shards/20200101T000000Z-deadbeef/train-00000-of-00002.tfrecord",  # a killed run's
            "shards/mine/notes.txt",
            "shards/backup-of-v1/train-00000-of-00001.tfrecord",  # the user's
            "shards/20200101T000000Z-deadbeef/notes.txt",
            f"{old}/my-notes.txt",
            "shards/loose.txt",
        ]
    }
    doomed = garbage(chain, [], existing, keep=2)
    assert doomed == sorted(
        [
            f"{old}/train-00000-of-00001.tfrecord",
            f"{old}/.train-00000-of-00001.tfrecord.json",
            f"{old}/dead_letters.jsonl",
            "shards/20200101T000000Z-deadbeef/train-00000-of-00002.tfrecord",
        ]
    )


def test_a_version_whose_dead_letters_are_gone_is_partly_collected_and_not_rolled_back_to():
    version = _version(2, [f"shards/{RUN}/train-00000-of-00001.tfrecord"], f"shards/{RUN}/dead_letters.jsonl")
    existing = {f"shards/{RUN}/train-00000-of-00001.tfrecord": 5}
    assert _missing_files(version, existing) == [f"shards/{RUN}/dead_letters.jsonl"]
    assert _files_state(version, existing) == "partly collected (dead letters gone)"


def test_a_commit_never_reuses_a_version_number_the_history_holds(tmp_path):
    """A root restored by hand from versions/ (a "manual rollback") must not make the next commit
    take a number whose history file, and a trainer pinned to it, exist already."""
    out = str(tmp_path)
    for _ in range(3):
        commit_version(out, {"splits": {}}, expected=read_current(out), change={"kind": "overwrite"})
    (tmp_path / "dataset_info.json").write_bytes((tmp_path / "versions" / "00000002.json").read_bytes())
    third = (tmp_path / "versions" / "00000003.json").read_bytes()
    committed = commit_version(out, {"splits": {}}, expected=read_current(out), change={"kind": "overwrite"})
    assert committed["version"] == 4 and committed["parent_version"] == 2
    assert (tmp_path / "versions" / "00000003.json").read_bytes() == third


def test_an_appended_version_states_missing_classes_from_its_merged_counts():
    base = {
        "label_names": ["cat", "dog"],
        "num_inputs": 3,
        "warnings": ["split 'validation' has no example of 1 class: 'dog'"],
        "splits": {
            "train": {"num_examples": 2, "class_counts": {"cat": 1, "dog": 1}, "shards": [{"file": "a"}]},
            "validation": {"num_examples": 1, "class_counts": {"cat": 1, "dog": 0}, "shards": [{"file": "b"}]},
        },
    }
    added = {
        "label_names": ["cat", "dog", "eel"],
        "num_inputs": 1,
        "warnings": [
            "split 'train' has no example of 2 classes: 'cat', 'dog'",
            "--splits train,validation was ignored: every input already has a split",
        ],
        "splits": {
            "train": {"num_examples": 1, "class_counts": {"cat": 0, "dog": 0, "eel": 1}, "shards": [{"file": "c"}]}
        },
    }
    merged = merge_appended(base, added)
    assert merged["warnings"] == ["split 'validation' has no example of 2 classes: 'dog', 'eel'"]
    assert merged["splits"]["train"]["class_counts"] == {"cat": 1, "dog": 1, "eel": 1}


@pytest.mark.slow
def test_relabelling_a_row_of_an_input_list_refuses_the_append_naming_it(tmp_path):
    photos = make_photo_tree(tmp_path / "photos", num_images=8, seed=2, classes=["coffee", "china"])
    rows = [f"{p},{p.parent.name},train" for p in sorted(photos)]
    (tmp_path / "one.csv").write_text("uri,label,split\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    job = [sys.executable, "-m", "beam_jobs", "--output_dir", str(out), "--image_size", "24"]
    subprocess.run([*job, "--manifest", str(tmp_path / "one.csv")], cwd=REPO, check=True, capture_output=True)
    first = sorted(photos)[0]
    relabelled = [row.replace(f"{first},{first.parent.name},", f"{first},relabelled,") for row in rows]
    (tmp_path / "two.csv").write_text("uri,label,split\n" + "\n".join(relabelled) + "\n")
    result = subprocess.run(
        [*job, "--manifest", str(tmp_path / "two.csv"), "--append"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stderr[-3000:]
    [error] = [line for line in result.stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]
    assert "1 input of version 1 changed (content, label, annotations, group or split)" in error, error
    # Named as the list names it, relative to the list's folder: no mount point in the message.
    assert f"({first.relative_to(tmp_path)})" in error and str(tmp_path) not in error, error
    assert json.loads((out / "dataset_info.json").read_text())["version"] == 1


def test_an_appends_plan_says_nothing_of_the_whole_dataset_from_its_new_inputs_alone():
    from beam_jobs.convert_images import _append_summary

    summary = {
        "num_inputs": 10,
        "warnings": [
            "--splits train,validation was ignored: every input already has a split",
            "split 'train' has no example of 1 class: 'cat'",
            "the classes 'Cat', 'cat' differ only by case; they are separate classes",
        ],
    }
    planned = _append_summary(summary, {"held": 8, "changed": 1, "removed": 0})
    assert planned["num_inputs"] == 1
    assert planned["warnings"] == ["the classes 'Cat', 'cat' differ only by case; they are separate classes"]


def _encoded_by_filename(out: pathlib.Path) -> dict[str, bytes]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from beam_jobs.imaging.example_proto import Example  # pylint: disable=import-outside-toplevel

    found = {}
    for shard in sorted(out.glob("shards/*/*.tfrecord")):
        for record in tf.data.TFRecordDataset(str(shard)).as_numpy_iterator():
            feature = Example.FromString(record).features.feature
            found[feature["image/filename"].bytes_list.value[0].decode()] = feature["image/encoded"].bytes_list.value[0]
    return found


@pytest.mark.slow
def test_a_dataset_made_before_resample_existed_appends_as_it_was_and_another_resample_is_refused(tmp_path):
    """Releases before --resample resampled with bicubic only and recorded no such setting: an
    append without --resample extends such a dataset with bicubic, byte for byte (the default of
    new datasets is another method), and one with another --resample is refused naming it."""
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=6, seed=2, classes=["coffee", "china"])
    out = tmp_path / "out"
    job = [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), "--image_size", "24"]
    subprocess.run([*job, "--resample", "bicubic"], cwd=REPO, check=True, capture_output=True)
    info = json.loads((out / "dataset_info.json").read_text())
    del info["preprocessing"]["resample"]  # as such a release wrote it
    (out / "dataset_info.json").write_text(json.dumps(info))
    for photo in make_photo_tree(tmp_path / "more", num_images=9, seed=2, classes=["coffee", "china"]):
        if not (photos / photo.parent.name / photo.name).exists():  # the 3 new ones
            photo.rename(photos / photo.parent.name / photo.name)
    refused = subprocess.run([*job, "--append", "--resample", "antialias"], cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "resample 'bicubic' there, 'antialias' now" in refused.stderr, refused.stderr[-2000:]
    appended = subprocess.run([*job, "--append"], cwd=REPO, capture_output=True, text=True)
    assert appended.returncode == 0, appended.stderr[-3000:]
    merged = json.loads((out / "dataset_info.json").read_text())
    assert merged["version"] == 2 and merged["splits"]["train"]["num_examples"] == 9
    whole = tmp_path / "whole"
    subprocess.run([*job[:-3], str(whole), *job[-2:], "--resample", "bicubic"], cwd=REPO, check=True)
    assert _encoded_by_filename(out) == _encoded_by_filename(whole)  # all 9, the 3 appended included
    default = tmp_path / "default"
    subprocess.run([*job[:-3], str(default), *job[-2:]], cwd=REPO, check=True)
    assert json.loads((default / "dataset_info.json").read_text())["preprocessing"]["resample"] == "dct_sinc"
    assert _encoded_by_filename(default) != _encoded_by_filename(whole)


@pytest.mark.slow
def test_an_append_may_cut_its_new_examples_into_another_shard_count_but_not_make_other_examples(tmp_path):
    """The shard count and size say how examples are cut into files, not what they are: an append
    to a dataset made with the automatic count may give --num_shards (it was refused as
    "num_shards None there"), and a refusal for another setting names that setting alone."""
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=6, seed=3, classes=["coffee", "china"])
    out = tmp_path / "out"
    job = [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), "--image_size", "24"]
    subprocess.run(job, cwd=REPO, check=True, capture_output=True)
    for photo in make_photo_tree(tmp_path / "more", num_images=10, seed=3, classes=["coffee", "china"]):
        if not (photos / photo.parent.name / photo.name).exists():  # the 4 new ones
            photo.rename(photos / photo.parent.name / photo.name)
    refused = subprocess.run(
        [*job[:-1], "32", "--append", "--num_shards", "2"], cwd=REPO, capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "image_size '24x24' there, '32x32' now" in refused.stderr and "num_shards" not in refused.stderr
    appended = subprocess.run([*job, "--append", "--num_shards", "2"], cwd=REPO, capture_output=True, text=True)
    assert appended.returncode == 0, appended.stderr[-3000:]
    merged = json.loads((out / "dataset_info.json").read_text())
    assert merged["version"] == 2 and merged["splits"]["train"]["num_examples"] == 10
    assert merged["fingerprint"] == json.loads((out / "versions" / "00000001.json").read_text())["fingerprint"]
    assert len(merged["splits"]["train"]["shards"]) == 3  # the version's one, and the append's two


@pytest.mark.slow
def test_an_append_whose_new_inputs_all_fail_names_them_and_leaves_no_run_to_resume(tmp_path):
    """It said "every listed input is in version 1 already" of a new file that was a dead letter,
    and its empty shard read as an interrupted run to the next run's warning."""
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=4, seed=4, classes=["coffee", "china"])
    out = tmp_path / "out"
    job = [sys.executable, "-m", "beam_jobs", "--input", str(photos), "--output_dir", str(out), "--image_size", "24"]
    subprocess.run(job, cwd=REPO, check=True, capture_output=True)
    committed_runs = [p.name for p in (out / "shards").iterdir()]
    (photos / "coffee" / "broken.jpg").write_bytes(b"not a photo")
    failed = subprocess.run([*job, "--append"], cwd=REPO, capture_output=True, text=True)
    assert failed.returncode == 0, failed.stderr[-3000:]
    [said] = [line for line in failed.stdout.splitlines() if line.startswith("--append:")]
    assert said.startswith("--append: version 1 stays current; nothing was committed: no input it did not hold ")
    assert "1 dead letter (not_an_image: 1) is in" in said
    letters = pathlib.Path(said.rsplit(" is in ", 1)[1])
    assert json.loads(letters.read_text())["uri"].endswith("broken.jpg")
    assert sorted(p.name for p in letters.parent.iterdir()) == ["dead_letters.jsonl"]  # no empty shard left
    (photos / "coffee" / "broken.jpg").unlink()
    again = subprocess.run([*job, "--append"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "interrupted" not in again.stderr, again.stderr[-3000:]
    assert "Found no new images: the 4 listed are in the current version" in again.stderr
    assert again.stdout.strip() == "--append: version 1 stays current; nothing was committed"
    # The run that found nothing new leaves no folder behind; the one whose dead letter it named stays.
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted([letters.parent.name, *committed_runs])

"""The job's command line as a careless or unlucky user drives it: nothing lost, nothing silently wrong.

Each test reproduces a defect that once lost work or wrote the wrong dataset (see the README's
reliability table), through the CLI in a fresh process.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import REPO, run_cli
from tests.dataset_files import current_files, dead_letters_path, flat_names, tree_files
from tests.photos import encode, real_photo

pytestmark = pytest.mark.slow

SMALL = ["--image_size", "32", "--num_shards", "2"]


def _info(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def _dead(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in dead_letters_path(out).read_text().splitlines()]


def _unchanged_beside_a_new_run(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    """Asserts every file of ``before`` is still there, byte for byte, and that what was added
    lies in run folders (a refused or interrupted run's, which no version lists); returns them."""
    assert {name: after.get(name) for name in before} == before, "a file of the dataset changed"
    added = set(after) - set(before)
    assert all(name.startswith("shards/") for name in added), sorted(added)
    return {name.split("/")[1] for name in added}


def _records(out: pathlib.Path) -> dict[str, dict]:
    """{image/filename: {sha256, encoded}} over every shard dataset_info.json lists."""
    spec = {
        key: tf.io.FixedLenFeature([], tf.string) for key in ("image/filename", "image/key/sha256", "image/encoded")
    }
    found = {}
    for split in _info(out)["splits"].values():
        for shard in split["shards"]:
            for record in tf.data.TFRecordDataset(str(out / shard["file"])):
                example = tf.io.parse_single_example(record, spec)
                found[example["image/filename"].numpy().decode()] = {
                    "sha256": example["image/key/sha256"].numpy().decode(),
                    "encoded": example["image/encoded"].numpy(),
                }
    return found


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("images-to-tfrecords: error:")]


def _assert_one_clear_error(result: subprocess.CompletedProcess, *, code: int, says: str) -> None:
    assert result.returncode == code, result.stderr[-3000:]
    errors = _error_lines(result)
    assert len(errors) == 1 and says in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.fixture()
def photos(tmp_path) -> pathlib.Path:
    root = tmp_path / "photos"
    make_photo_tree(root, num_images=8, seed=3)
    return root


# --- 1. --overwrite replaces a dataset only when the new run succeeds ---------------------------


def test_overwrite_with_a_mistyped_input_keeps_the_old_dataset(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    before = tree_files(out)
    result = run_cli("--input", tmp_path / "photoz", "--output_dir", out, "--overwrite", *SMALL, check=False)
    _assert_one_clear_error(result, code=2, says="photoz does not exist")
    assert tree_files(out) == before


def test_a_refused_overwrite_run_leaves_the_old_dataset_whole(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    before = tree_files(out)
    before_run = tree_files(out / "shards" / _info(out)["change"]["run"])
    (photos / "chelsea" / "broken.jpg").write_bytes(b"<html>not found</html>")
    result = run_cli(
        "--input", photos, "--output_dir", out, "--overwrite", "--max_bad_fraction", "0", *SMALL, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "version 1 of the dataset stays current, unchanged" in _error_lines(result)[0]
    # Its shards stay in its own folder, which no version lists, for --resume, and the message
    # says so; its dead letters are beside them, not in the version's.
    assert "a rerun with --resume reuses " in _error_lines(result)[0]
    # The fix for too many bad inputs is the threshold (or the files), not the same flags again.
    assert "accept them by rerunning with --max_bad_fraction=0." in _error_lines(result)[0], _error_lines(result)[0]
    assert "the same flags" not in _error_lines(result)[0]
    assert len(_unchanged_beside_a_new_run(before, tree_files(out))) == 1
    assert tree_files(out / "shards" / _info(out)["change"]["run"]) == before_run
    [refused] = [p for p in (out / "shards").iterdir() if p.name != _info(out)["change"]["run"]]
    assert str(refused) in _error_lines(result)[0]
    assert [d["reason"] for d in map(json.loads, (refused / "dead_letters.jsonl").read_text().splitlines())] == [
        "not_an_image"
    ]


def test_overwrite_replaces_the_dataset_and_spares_the_users_own_files(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, "--image_size", "32", "--num_shards", "3")
    (out / "backup-00000-of-00001.tfrecord").write_bytes(b"the user's own file")
    (out / "notes.txt").write_text("mine")
    run_cli("--input", photos, "--output_dir", out, "--overwrite", *SMALL)
    # The first version's files stay for the retention window (the version before the current one).
    names = flat_names(out)
    first = [n for n in names if n.startswith("shards/")]
    assert len(first) == 1 and names == sorted(
        [
            "backup-00000-of-00001.tfrecord",
            "dataset_info.json",
            "dead_letters.jsonl",
            "notes.txt",
            *first,
            "train-00000-of-00002.tfrecord",
            "train-00001-of-00002.tfrecord",
        ]
    )
    assert (out / "backup-00000-of-00001.tfrecord").read_bytes() == b"the user's own file"
    assert _info(out)["splits"]["train"]["num_shards"] == 2


# --- 2. --resume never keeps a shard whose sources changed --------------------------------------


def test_resume_converts_a_repaired_input(photos, tmp_path):
    out = tmp_path / "out"
    broken = photos / "chelsea" / "repaired.jpg"
    broken.write_bytes(encode(real_photo("chelsea"), "JPEG")[:3000])  # truncated
    run_cli("--input", photos, "--output_dir", out, "--max_bad_fraction", "0", *SMALL, check=False)
    assert not (out / "dataset_info.json").exists()
    broken.write_bytes(encode(real_photo("chelsea", (200, 150)), "JPEG"))
    run_cli("--input", photos, "--output_dir", out, "--max_bad_fraction", "0", "--resume", *SMALL)
    assert _dead(out) == []
    assert "chelsea/repaired.jpg" in _records(out)


def test_resume_rereads_an_image_replaced_under_the_same_name(photos, tmp_path):
    out, reference = tmp_path / "out", tmp_path / "reference"
    (photos / "chelsea" / "broken.jpg").write_bytes(b"")
    # Refused for its one bad input: the converted shards stay in its run folder, as an interrupted run's do.
    run_cli("--input", photos, "--output_dir", out, "--max_bad_fraction", "0", *SMALL, check=False)
    assert list(out.glob("shards/*/.train-*.json")) and not (out / "dataset_info.json").exists()
    victim = sorted(photos.rglob("*.jpg"))[0]
    victim.write_bytes(encode(real_photo("astronaut", (320, 240)), "JPEG"))
    run_cli("--input", photos, "--output_dir", out, "--resume", "--max_bad_fraction", "0.5", *SMALL)
    run_cli("--input", photos, "--output_dir", reference, "--max_bad_fraction", "0.5", *SMALL)
    name = str(victim.relative_to(photos))
    assert _records(out)[name] == _records(reference)[name]
    assert current_files(out) == current_files(reference)


# --- 3. a misspelt flag is an error, not a silent default ----------------------------------------


@pytest.mark.parametrize(
    ("flag", "suggestion"),
    [
        (["--image-size", "64"], "--image_size"),
        (["--num_shard", "3"], "--num_shards"),
        (["--outptu_dir", "x"], "--output_dir"),
    ],
)
def test_a_misspelt_flag_is_a_one_line_error_naming_the_right_one(photos, tmp_path, flag, suggestion):
    out = tmp_path / "out"
    result = run_cli("--input", photos, "--output_dir", out, *flag, check=False)
    _assert_one_clear_error(result, code=2, says=f"did you mean {suggestion}?")
    assert not out.exists()


def test_beams_own_flags_still_pass(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *SMALL, "--direct_num_workers", "1", "--experiments", "beam_fn_api")
    assert _info(out)["splits"]["train"]["num_examples"] == 8


# --- 4. a relative --manifest, as most people pass it ---------------------------------------------


@pytest.mark.parametrize("spelling", ["list.csv", "./list.csv"])
def test_a_relative_input_list_resolves_against_the_working_directory(photos, spelling):
    rows = ["uri,label"] + [f"{p.relative_to(photos)},{p.parent.name}" for p in sorted(photos.rglob("*.jpg"))]
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs", "--manifest", spelling, "--output_dir", "out", *SMALL],
        cwd=photos,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _info(photos / "out")["splits"]["train"]["num_examples"] == 8
    assert _dead(photos / "out") == []


# --- 5. every character a file name may hold ------------------------------------------------------


def test_glob_characters_in_input_and_output_paths_are_literal(tmp_path):
    root = tmp_path / "photos [2024] *?"
    make_photo_tree(root, num_images=6, seed=5, classes=["astronaut", "chelsea"])
    (root / "astronaut").rename(root / "cat [1]")
    (root / "chelsea").rename(root / "dog*?#")
    first = sorted((root / "dog*?#").iterdir())[0]
    first.rename(first.with_name("a?b#c.jpg"))
    out = tmp_path / "out [v1]"
    for attempt in range(2):  # The second run is refused without a flag, and must leave no probe.
        result = run_cli("--input", root, "--output_dir", out, *SMALL, check=False)
        assert result.returncode == (0 if attempt == 0 else 2), result.stderr[-3000:]
    names = flat_names(out)
    assert names == [
        "dataset_info.json",
        "dead_letters.jsonl",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert _info(out)["label_names"] == ["cat [1]", "dog*?#"]
    assert sorted(_records(out)) == sorted(str(p.relative_to(root)) for p in root.rglob("*.jpg"))
    first = _info(out)["change"]["run"]
    run_cli("--input", root, "--output_dir", out, *SMALL, "--overwrite")
    assert flat_names(out) == sorted([*names, f"shards/{first}"])


# --- 6. copies dropped on purpose are not unusable inputs ----------------------------------------


def test_dedup_content_drops_copies_without_failing_the_job(photos, tmp_path):
    for index, path in enumerate(sorted(photos.rglob("*.jpg"))[:3]):
        shutil.copy(path, path.with_name(f"copy{index}.jpg"))
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, "--dedup", "content", *SMALL)  # default --max_bad_fraction
    info = _info(out)
    assert info["splits"]["train"]["num_examples"] == 8
    assert info["dead_letters_by_reason"] == {"duplicate_content": 3}


# --- 7. the same path twice, with a blank split ---------------------------------------------------


def test_a_path_listed_twice_with_and_without_a_split_keeps_the_row_with_the_split(photos, tmp_path):
    images = sorted(photos.rglob("*.jpg"))
    rows = ["uri,label,split"] + [f"{p.relative_to(photos)},{p.parent.name},train" for p in images]
    rows.append(f"{images[0].relative_to(photos)},{images[0].parent.name},")
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    jsonl = photos / "list.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                {"uri": str(p.relative_to(photos)), "label": p.parent.name, "split": None if i == 0 else "train"}
            )
            + "\n"
            for i, p in enumerate(images + images[:1])
        )
    )
    for listing, line in ((photos / "list.csv", 10), (jsonl, 1)):
        out = tmp_path / listing.suffix[1:]
        result = run_cli("--manifest", listing, "--output_dir", out, *SMALL)  # default --max_bad_fraction
        dead = _dead(out)
        assert [d["reason"] for d in dead] == ["duplicate_input"]
        assert f"{listing}:{line}" in dead[0]["detail"]
        assert _info(out)["splits"]["train"]["num_examples"] == 8
        assert "0 inputs could not be used, 1 copies dropped" in result.stdout


def test_a_path_listed_with_two_labels_is_refused_naming_each_row(photos, tmp_path):
    images = sorted(photos.rglob("*.jpg"))
    rows = ["uri,label"] + [f"{p.relative_to(photos)},{p.parent.name}" for p in images]
    rows.append(f"{images[0].relative_to(photos)},not-{images[0].parent.name}")
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    run_cli("--manifest", photos / "list.csv", "--output_dir", out, "--max_bad_fraction", "0.5", *SMALL)
    dead = _dead(out)
    assert [d["reason"] for d in dead] == ["conflicting_labels"] * 2
    assert dead[0]["detail"] != dead[1]["detail"]
    assert {f"list.csv:{n})" for n in (2, 10)} == {d["detail"].rsplit("/", 1)[-1] for d in dead}


def test_a_split_that_cannot_name_a_file_is_a_bad_row(photos, tmp_path):
    images = sorted(photos.rglob("*.jpg"))
    rows = ["uri,label,split"] + [f"{p.relative_to(photos)},{p.parent.name},train" for p in images[1:]]
    rows.append(f"{images[0].relative_to(photos)},{images[0].parent.name},../evil")
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    run_cli("--manifest", photos / "list.csv", "--output_dir", out, "--max_bad_fraction", "0.5", *SMALL)
    # A split name goes through the one naming policy (folders and lists alike): bad_label.
    assert [(d["reason"], d["uri"].endswith("list.csv:9")) for d in _dead(out)] == [("bad_label", True)]
    assert "cannot name shard files" in _dead(out)[0]["detail"]
    assert flat_names(out) == [
        "dataset_info.json",
        "dead_letters.jsonl",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]


def test_a_three_level_tree_is_split_label_only_when_its_top_folders_are_splits(tmp_path):
    years = tmp_path / "years"
    for year in ("2023", "2024"):  # years/cat/<year>/<image>: a label, then a year
        (years / "cat" / year).mkdir(parents=True)
        for path in make_photo_tree(tmp_path / f"src{year}", num_images=2, seed=int(year), classes=["chelsea"]):
            path.rename(years / "cat" / year / path.name)
    result = run_cli("--input", years, "--output_dir", tmp_path / "auto", *SMALL, check=False)
    assert result.returncode == 1 and "--tree_layout split_label" in dead_letters_path(tmp_path / "auto").read_text()
    run_cli("--input", years, "--output_dir", tmp_path / "forced", "--tree_layout", "split_label", *SMALL)
    assert sorted(_info(tmp_path / "forced")["splits"]) == ["cat"]
    splits = tmp_path / "splits"
    for split in ("train", "validation"):
        make_photo_tree(splits / split, num_images=4, seed=len(split), classes=["astronaut", "chelsea"])
    run_cli("--input", splits, "--output_dir", tmp_path / "detected", "--num_shards", "1", "--image_size", "32")
    info = _info(tmp_path / "detected")
    assert sorted(info["splits"]) == ["train", "validation"] and info["label_names"] == ["astronaut", "chelsea"]


# --- 8. clear errors, and no empty folder left behind --------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--manifest", "{tmp}/missing.csv"], "missing.csv does not exist"),
        (["--input", "{photos}/astronaut/astronaut_00000.jpg"], "is a file"),
        (["--input", "{tmp}/nowhere"], "nowhere does not exist"),
        (["--input", "{photos}", "--target_shard_mb", "0.0000001"], "--target_shard_mb must be"),
        (["--input", "{photos}", "--target_shard_mb", "inf"], "--target_shard_mb must be"),
        (["--input", "{photos}", "--max_file_mb", "nan"], "--max_file_mb must be"),
        (["--input", "{photos}", "--image_size", "abc"], "--image_size"),
        (["--input", "{photos}", "--num_shards=-3"], "--num_shards must be"),
        (["--input", "{photos}", "stray"], "unexpected argument 'stray'"),
        (["--input", "{photos}", "--image_size", "64", "--image_size", "128"], "--image_size is given more than once"),
        (["--input=", "--manifest", "{tmp}/list.csv"], "--input needs a value"),
        (["--input", "{photos}", "--runner", "bogus"], "--runner bogus is not a runner"),
    ],
)
def test_bad_arguments_give_one_line_and_create_nothing(photos, tmp_path, args, says):
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path, photos=photos) for a in args]
    result = run_cli(*args, "--output_dir", out, check=False)
    _assert_one_clear_error(result, code=2, says=says)
    assert not out.exists()


@pytest.mark.parametrize("inside", [".", "out", "astronaut/out"])
def test_an_output_folder_in_the_input_tree_is_refused_before_any_work(photos, inside):
    before = sorted(str(p) for p in photos.rglob("*"))
    result = run_cli("--input", photos, "--output_dir", photos / inside, *SMALL, check=False)
    _assert_one_clear_error(result, code=2, says="the --input tree")
    assert sorted(str(p) for p in photos.rglob("*")) == before


def test_a_flat_folder_is_refused_naming_the_layout_it_needs(photos, tmp_path):
    """No class folders: every image is unexpected_layout; the one error line says the fix, and a
    refused run that planned no shard leaves only its dead letters."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for index, image in enumerate(sorted(photos.rglob("*.jpg"))[:4]):
        image.rename(flat / f"img{index}.jpg")
    out = tmp_path / "out"
    result = run_cli("--input", flat, "--output_dir", out, *SMALL, check=False)
    _assert_one_clear_error(result, code=1, says="main reasons: unexpected_layout 4")
    assert "put them in class folders, or give a CSV or JSONL list with --manifest" in _error_lines(result)[0]
    assert flat_names(out) == ["dead_letters.jsonl"]


def test_an_input_list_of_entries_outside_its_folder_is_refused_naming_the_flag(photos, tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    rows = "".join(f"{p},{p.parent.name}\n" for p in sorted(photos.rglob("*.jpg")))
    (lists / "list.csv").write_text("uri,label\n" + rows)
    result = run_cli("--manifest", lists / "list.csv", "--output_dir", tmp_path / "out", *SMALL, check=False)
    _assert_one_clear_error(result, code=1, says="main reasons: outside_input_root 8")
    assert "pass --allow_outside_root to accept them" in _error_lines(result)[0]


def test_a_failure_inside_the_pipeline_is_one_line_and_leaves_no_folder(tmp_path):
    root = tmp_path / "no-images"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "notes.txt").write_text("no image here")
    out = tmp_path / "out"
    result = run_cli("--input", root, "--output_dir", out, check=False)
    _assert_one_clear_error(result, code=1, says="no image files found")
    assert not out.exists()
    debug = run_cli("--input", root, "--output_dir", out, "--log_level", "DEBUG", check=False)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_an_output_dir_that_is_a_file_is_named_as_such(photos, tmp_path):
    target = tmp_path / "afile"
    target.write_text("mine")
    result = run_cli("--input", photos, "--output_dir", target, check=False)
    _assert_one_clear_error(result, code=2, says="is a file, not a folder")
    assert target.read_text() == "mine"


def test_a_failed_run_removes_every_folder_it_created(tmp_path):
    root = tmp_path / "no-images"
    (root / "cat").mkdir(parents=True)
    result = run_cli("--input", root, "--output_dir", tmp_path / "n1" / "n2" / "n3", check=False)
    _assert_one_clear_error(result, code=1, says="no image files found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-images"]


# --- concurrent and interrupted runs ---------------------------------------------------------------


def test_a_second_run_into_a_busy_folder_is_refused(photos, tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(photos),
            "--output_dir",
            str(out),
            *SMALL,
            "--direct_num_workers",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = out / ".images-to-tfrecords.lock"
        for _ in range(600):
            if lock.exists() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert lock.exists(), "the first run never took the lock"
        # Held still while the second run starts: a run of 8 images can end within a second, before
        # the second has imported Beam. A stopped process is a live one, as a slow run's is.
        first.send_signal(signal.SIGSTOP)
        second = run_cli("--input", photos, "--output_dir", out, "--overwrite", *SMALL, check=False)
        _assert_one_clear_error(second, code=2, says="is writing into")  # refused before any work
        assert f"process {first.pid}" in second.stderr
    finally:
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert not lock.exists()
    assert _info(out)["splits"]["train"]["num_examples"] == 8


def test_a_lock_left_by_a_killed_run_is_taken_over(photos, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".images-to-tfrecords.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    # What a SIGKILL in the first seconds leaves: the probe, or the lock between write and rename.
    # Neither is data: a plain rerun (no --resume) removes them instead of calling the folder taken.
    (out / f".tmp-{'a' * 32}-probe").write_text("images-to-tfrecords write probe\n")
    (out / f".tmp-{'b' * 32}-.images-to-tfrecords.lock").write_text("{}")
    run_cli("--input", photos, "--output_dir", out, *SMALL)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".commit.lock"]


def test_an_interrupted_overwrite_run_can_be_resumed(photos, tmp_path):
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, "--image_size", "48", "--num_shards", "3")
    old = tree_files(out)
    (photos / "chelsea" / "broken.jpg").write_bytes(b"")
    # Refused: its shards stay in its run folder, as an interrupted run's do; the old dataset is untouched.
    run_cli("--input", photos, "--output_dir", out, "--overwrite", "--max_bad_fraction", "0", *SMALL, check=False)
    assert len(_unchanged_beside_a_new_run(old, tree_files(out))) == 1
    resumed = run_cli(
        "--input",
        photos,
        "--output_dir",
        out,
        "--overwrite",
        "--resume",
        "--max_bad_fraction",
        "0.5",
        *SMALL,
        "--log_level",
        "INFO",
    )  # INFO names kept shards
    assert resumed.stderr.count("complete and verified") == 2
    assert _info(out)["splits"]["train"]["num_shards"] == 2

"""The listing policy on real trees: symlinked, dangling and looping folders, hidden folders, FIFOs,
sockets and backslashes in names, for class-per-folder trees and input lists alike."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import socket
import unicodedata

import pytest
from apache_beam.io.filesystem import FileMetadata

from beam_jobs.listing.discover import (
    _first_level,
    _list_unit,
    _without_hidden,
    is_image_filename,
    parse_input_list,
    relative_filename,
)
from beam_jobs.listing.policy import Decision, EntryFacts, IgnoredEntry, Kind, decide, ignored_note
from beam_jobs.records import DeadLetter, InputFile
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli
from tests.dataset_files import dead_letters_path


def _release_fifo_readers(fifo: pathlib.Path) -> None:
    """Opens the FIFO's write end once, so that a reader blocked in open() returns (and finds EOF);
    ENXIO means no reader was waiting."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture()
def fifos():
    """Makes FIFOs, and at the end releases whatever reader is still blocked opening one."""
    made: list[pathlib.Path] = []

    def make(path: pathlib.Path) -> pathlib.Path:
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for fifo in made:
        _release_fifo_readers(fifo)


def _bind_socket(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


# -- the policy as a pure function -------------------------------------------------------------


@pytest.mark.parametrize(
    "facts, allow, from_list, expected",
    [
        (EntryFacts("a.jpg", Kind.FILE, image_name=True), False, False, Decision("list")),
        (EntryFacts("notes.txt", Kind.FILE), False, False, Decision("ignore", "not_image")),
        (EntryFacts("cats", Kind.FOLDER), False, False, Decision("descend")),
        (EntryFacts("cats", Kind.FOLDER, via_symlink=True), False, False, Decision("descend")),
        (
            EntryFacts("cats", Kind.FOLDER, via_symlink=True, outside_root=True),
            False,
            False,
            Decision("dead", "outside_input_root"),
        ),
        (EntryFacts("cats", Kind.FOLDER, via_symlink=True, outside_root=True), True, False, Decision("descend")),
        (EntryFacts("loop", Kind.LOOP, via_symlink=True), True, False, Decision("dead", "symlink_loop")),
        (
            EntryFacts("gone.jpg", Kind.MISSING, via_symlink=True, image_name=True),
            True,
            False,
            Decision("dead", "dangling_symlink"),
        ),
        (EntryFacts(".#gone.jpg", Kind.MISSING, via_symlink=True), False, False, Decision("ignore", "hidden")),
        (EntryFacts(".thumbs", Kind.FOLDER), True, False, Decision("ignore", "hidden")),
        (EntryFacts(".git", Kind.FOLDER), True, False, Decision("ignore", "hidden")),
        (EntryFacts("pipe.jpg", Kind.SPECIAL, image_name=True), True, False, Decision("ignore", "special")),
        (EntryFacts("pipe.jpg", Kind.SPECIAL, image_name=True), True, True, Decision("dead", "not_a_regular_file")),
        (EntryFacts("d.jpg", Kind.FOLDER, image_name=True), True, True, Decision("dead", "not_a_regular_file")),
        (EntryFacts("gone.jpg", Kind.MISSING, via_symlink=True), True, True, Decision("dead", "dangling_symlink")),
        (
            EntryFacts("a.jpg", Kind.FILE, via_symlink=True, outside_root=True, image_name=True),
            False,
            True,
            Decision("list"),
        ),  # a file leading out is refused by resolve_inside_root, naming its uri
    ],
)
def test_one_decision_per_kind_of_entry(facts, allow, from_list, expected):
    assert decide(facts, allow_outside_root=allow, from_list=from_list) == expected


def test_the_plan_line_tail_counts_what_was_ignored():
    assert ignored_note({}) == ""
    assert ignored_note({"special": 1, "hidden": 3}) == "; ignored: 3 hidden, 1 special"
    assert ignored_note({"not_image": 2, "hidden": 1}) == "; ignored: 1 hidden, 2 non-image"


def test_a_backslash_is_part_of_a_name_never_a_separator():
    assert relative_filename("/r/", "/r/a\\b/1.jpg") == "a\\b/1.jpg"
    assert relative_filename("s3://b/t/", "s3://b/t/x\\y.jpg") == "x\\y.jpg"
    assert is_image_filename("cats/dog\\.jpg")  # one file "dog\.jpg", not a hidden ".jpg"
    assert is_image_filename("s3://b/t/1.jpg\\x") is False


# -- local trees, listed unit by unit as the job does ----------------------------------------------


def _list_tree(root: pathlib.Path, *, allow_outside_root: bool = False) -> list:
    """Everything the tree listing emits: FileMetadata, DeadLetter and IgnoredEntry."""
    top = str(root).rstrip("/") + "/"
    return [
        entry
        for unit in _first_level(top, allow_outside_root=allow_outside_root)
        for entry in _list_unit(unit, allow_outside_root=allow_outside_root)
    ]


def _files(entries: list, root: pathlib.Path) -> list[str]:
    return sorted(
        relative_filename(str(root) + "/", e.path)
        for e in entries
        if not isinstance(e, (DeadLetter, IgnoredEntry)) and is_image_filename(e.path)
    )


def _dead(entries: list) -> list[tuple[str, str]]:
    return sorted((e.uri, e.reason) for e in entries if isinstance(e, DeadLetter))


def _ignored(entries: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        if isinstance(entry, IgnoredEntry):
            counts[entry.kind] = counts.get(entry.kind, 0) + 1
    return counts


@pytest.fixture()
def messy(tmp_path, fifos):
    """A tree with a class folder of its own, one symlinked from inside the root, one symlinked from
    outside, a dangling symlink, two loops, hidden folders at both depths, a FIFO and a socket."""
    root = tmp_path / "root"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "1.jpg").write_bytes(b"x")
    (root / "cat" / "2.jpg").write_bytes(b"x")
    (root / "store" / "dog").mkdir(parents=True)
    (root / "store" / "dog" / "3.jpg").write_bytes(b"x")
    (root / "dog").symlink_to(root / "store" / "dog")  # inside the root
    (tmp_path / "elsewhere" / "bird").mkdir(parents=True)
    (tmp_path / "elsewhere" / "bird" / "4.jpg").write_bytes(b"x")
    (root / "bird").symlink_to(tmp_path / "elsewhere" / "bird")  # outside the root
    (root / "fish").symlink_to(tmp_path / "no-such-folder")  # dangling
    (root / "cat" / "again").symlink_to(root / "cat")  # a loop into itself
    (root / "cat" / "up").symlink_to("..")  # a loop to the root
    (root / "self").symlink_to(root / "self")  # ELOOP
    (root / ".thumbs").mkdir()
    (root / ".thumbs" / "5.jpg").write_bytes(b"x")
    (root / "cat" / ".thumbnails").mkdir()
    (root / "cat" / ".thumbnails" / "6.jpg").write_bytes(b"x")
    (root / "cat" / ".DS_Store").write_bytes(b"x")
    (root / "cat" / ".#1.jpg").symlink_to("user@host.1234")  # an editor's lock: dangling, hidden
    fifos(root / "cat" / "pipe.jpg")
    (root / "cat" / "zero.jpg").symlink_to("/dev/zero")  # endless bytes: a device, never read
    sock = _bind_socket(root / "cat" / "sock.jpg")
    yield root, tmp_path
    sock.close()


def test_symlinked_folders_dangling_links_and_loops_are_never_silent(messy):
    root, _ = messy
    entries = _list_tree(root)
    assert _files(entries, root) == ["cat/1.jpg", "cat/2.jpg", "dog/3.jpg", "store/dog/3.jpg"]
    assert _dead(entries) == sorted(
        [
            (f"{root}/bird", "outside_input_root"),
            (f"{root}/fish", "dangling_symlink"),
            (f"{root}/self", "symlink_loop"),
            (f"{root}/cat/again", "symlink_loop"),
            (f"{root}/cat/up", "symlink_loop"),
        ]
    )
    assert _ignored(entries) == {"hidden": 4, "special": 3}


def test_a_symlinked_folder_out_of_the_root_is_followed_with_the_opt_in_flag(messy):
    root, _ = messy
    entries = _list_tree(root, allow_outside_root=True)
    assert "bird/4.jpg" in _files(entries, root)
    assert (f"{root}/bird", "outside_input_root") not in _dead(entries)


def test_object_store_keys_under_hidden_names_are_skipped_once_per_hidden_folder():
    unit = "gs://b/tree/cat/"
    metas = [
        FileMetadata(unit + name, 1, 0.0)
        for name in ["a.jpg", ".thumbnails/a.jpg", ".thumbnails/b.jpg", "x/.git/c.jpg", "._a.jpg", "a\\b.jpg"]
    ]
    kept = list(_without_hidden(iter(metas), unit=unit))
    assert [m.path for m in kept if isinstance(m, FileMetadata)] == [unit + "a.jpg", unit + "a\\b.jpg"]
    assert [m for m in kept if isinstance(m, IgnoredEntry)] == [IgnoredEntry("hidden")] * 3


# -- whole runs, from the CLI -----------------------------------------------------------------------


def _dead_letters(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in dead_letters_path(out).read_text().splitlines()]


def _info(out: pathlib.Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


@pytest.mark.slow
def test_a_messy_tree_converts_by_the_policy_and_the_plan_line_counts_what_was_ignored(tmp_path, fifos):
    root = tmp_path / "root"
    photos = make_photo_tree(root, num_images=8, seed=21)  # real photos in class folders
    classes = sorted({p.parent.name for p in photos})
    outside = tmp_path / "elsewhere" / "bird"
    outside.mkdir(parents=True)
    shutil.copy(photos[0], outside / "b1.jpg")
    (root / "bird").symlink_to(outside)
    (root / "fish").symlink_to(tmp_path / "gone")
    (root / classes[0] / "loop").symlink_to("..")
    (root / ".thumbs").mkdir()
    shutil.copy(photos[1], root / ".thumbs" / "t.jpg")
    (root / classes[0] / ".thumbnails").mkdir()
    shutil.copy(photos[1], root / classes[0] / ".thumbnails" / "t.jpg")
    fifos(root / classes[1] / "pipe.jpg")
    (root / "a\\b").mkdir()
    shutil.copy(photos[2], root / "a\\b" / "x.jpg")

    out = tmp_path / "out"
    result = run_cli("--input", root, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.5", "-v")
    info = _info(out)
    assert info["label_names"] == sorted([*classes, "a\\b"])
    assert info["splits"]["train"]["num_examples"] == len(photos) + 1
    assert sorted((d["uri"], d["reason"]) for d in _dead_letters(out)) == sorted(
        [
            (f"{root}/bird", "outside_input_root"),
            (f"{root}/fish", "dangling_symlink"),
            (f"{root}/{classes[0]}/loop", "symlink_loop"),
        ]
    )
    assert "ignored: 2 hidden, 1 special" in result.stdout + result.stderr

    out2 = tmp_path / "out2"
    run_cli(
        "--input", root, "--output_dir", out2, "--image_size", "32", "--max_bad_fraction", "0.5", "--allow_outside_root"
    )
    assert _info(out2)["label_names"] == sorted([*classes, "a\\b", "bird"])


@pytest.mark.slow
def test_a_plan_counts_what_the_listing_ignored(tmp_path):
    root = tmp_path / "root"
    photos = make_photo_tree(root, num_images=4, seed=25)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    shutil.copy(photos[0], root / photos[0].parent.name / ".hidden.jpg")
    (root / "README.txt").write_text("photos")
    plan_dir = tmp_path / "plan"
    result = run_cli("--input", root, "--output_dir", plan_dir, "--image_size", "32", "--plan_only")
    assert "; ignored: 2 hidden, 1 non-image; wrote" in result.stdout
    assert json.loads((plan_dir / "plan.json").read_text())["ignored"] == {"hidden": 2, "not_image": 1}


@pytest.mark.slow
def test_a_plan_line_names_an_empty_class_folder(tmp_path):
    root = tmp_path / "root"
    make_photo_tree(root, num_images=4, seed=26)
    (root / "empty").mkdir()
    plan_dir = tmp_path / "plan"
    result = run_cli("--input", root, "--output_dir", plan_dir, "--image_size", "32", "--plan_only")
    assert "; ignored: 1 empty folder; wrote" in result.stdout
    assert json.loads((plan_dir / "plan.json").read_text())["ignored"] == {"empty_folder": 1}
    assert "empty" not in json.loads((plan_dir / "plan.json").read_text())["label_names"]


# -- input lists ------------------------------------------------------------------------------------


def test_list_labels_and_splits_follow_the_one_naming_policy():
    nfd = unicodedata.normalize("NFD", "café")
    rows = [
        {"uri": "1.jpg", "label": "café"},
        {"uri": "2.jpg", "label": nfd},
        {"uri": "3.jpg", "label": "cat"},
        {"uri": "4.jpg", "label": "cat "},
        {"uri": "5.jpg", "label": "  "},
        {"uri": "6.jpg", "label": "a\nb"},
        {"uri": "7.jpg", "label": "cat", "split": "Validation"},
        {"uri": "8.jpg", "label": "cat", "split": "validation"},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    listed = list(parse_input_list(text, list_uri="/data/list.jsonl"))
    good = [r for r in listed if isinstance(r, InputFile)]
    assert sorted({r.label for r in good}) == ["café", "cat"]
    assert [r.split for r in good if r.split] == ["validation", "validation"]
    assert [(r.uri, r.reason) for r in listed if isinstance(r, DeadLetter)] == [
        ("/data/list.jsonl:5", "bad_label"),
        ("/data/list.jsonl:6", "bad_label"),
    ]


def test_list_rows_naming_a_fifo_a_folder_or_a_dangling_link_are_dead_letters_never_opened(tmp_path, fifos):
    fifos(tmp_path / "pipe.jpg")
    (tmp_path / "folder.jpg").mkdir()
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    text = "uri,label\npipe.jpg,a\nfolder.jpg,a\ngone.jpg,a\n"
    listed = list(parse_input_list(text, list_uri=str(tmp_path / "list.csv")))
    assert [(r.uri, r.reason) for r in listed] == [
        (f"{tmp_path}/list.csv:2", "not_a_regular_file"),
        (f"{tmp_path}/list.csv:3", "not_a_regular_file"),
        (f"{tmp_path}/list.csv:4", "dangling_symlink"),
    ]
    assert "pipe.jpg" in listed[0].detail


@pytest.mark.parametrize("allow_outside_root", [False, True])
def test_a_listed_dangling_link_out_of_the_root_is_dangling_not_outside(tmp_path, allow_outside_root):
    """A dangling link's target cannot be read, so whether it is outside the root does not matter:
    the dead letter says what is wrong (it leads nowhere), with or without --allow_outside_root."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "dang.jpg").symlink_to("/nope")
    text = "uri,label\nimgs/dang.jpg,a\n"
    listed = list(parse_input_list(text, list_uri=str(tmp_path / "list.csv"), allow_outside_root=allow_outside_root))
    assert [(r.uri, r.reason) for r in listed] == [(f"{tmp_path}/list.csv:2", "dangling_symlink")]
    assert "'/nope'" in listed[0].detail and "--allow_outside_root" not in listed[0].detail


def test_an_empty_class_folder_is_counted_in_the_ignored_note(tmp_path):
    """Keras makes a class of an empty folder; this listing makes none, so the plan line says so."""
    root = tmp_path / "root"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "1.jpg").write_bytes(b"x")
    (root / "empty").mkdir()
    (root / "cat" / "nothing").mkdir()
    entries = _list_tree(root)
    assert _files(entries, root) == ["cat/1.jpg"]
    counts = _ignored(entries)
    assert counts == {"empty_folder": 2}
    assert ignored_note(counts) == "; ignored: 2 empty folders"
    assert ignored_note({"empty_folder": 1, "hidden": 1}) == "; ignored: 1 hidden, 1 empty folder"


@pytest.mark.slow
def test_a_list_naming_a_fifo_finishes_with_a_dead_letter(tmp_path, fifos):
    photos = make_photo_tree(tmp_path / "img", num_images=3, seed=22)
    fifos(tmp_path / "img" / "pipe.jpg")
    manifest = tmp_path / "list.csv"
    manifest.write_text("uri,label\n" + "".join(f"{p.relative_to(tmp_path)},a\n" for p in photos) + "img/pipe.jpg,a\n")
    out = tmp_path / "out"
    run_cli("--manifest", manifest, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.5")
    assert [(d["uri"], d["reason"]) for d in _dead_letters(out)] == [(f"{manifest}:5", "not_a_regular_file")]
    assert _info(out)["splits"]["train"]["num_examples"] == 3

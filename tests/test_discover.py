"""Listing: image extensions, and CSV/JSONL manifests whose bad rows become dead letters."""

from __future__ import annotations

import pytest

from beam_jobs.listing.discover import is_image_filename, parse_input_list
from beam_jobs.records import DeadLetter, InputFile


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a/b.jpg", True),
        ("a/B.JPEG", True),
        ("x.Png", True),
        ("y.webp", True),
        ("z.TIFF", True),
        ("notes.txt", False),
        ("a/.DS_Store", False),
        ("a/._b.jpg", False),
        ("noext", False),
        ("été/ñ.jpg", True),
    ],
)
def test_image_extensions_are_matched_case_insensitively(name, expected):
    assert is_image_filename(name) is expected


def test_csv_manifest_with_relative_and_absolute_uris():
    text = "uri,label,split\ncats/1.jpg,cat,train\n/data/dogs/2.png,dog,\n"
    rows = list(parse_input_list(text, list_uri="/data/manifest.csv"))
    assert rows == [
        InputFile(
            filename="cats/1.jpg", uri="/data/cats/1.jpg", label="cat", split="train", origin="/data/manifest.csv:2"
        ),
        InputFile(
            filename="dogs/2.png", uri="/data/dogs/2.png", label="dog", split=None, origin="/data/manifest.csv:3"
        ),
    ]


def test_csv_bad_rows_are_dead_letters_with_line_numbers():
    text = '\ufeffuri,label\r\na.jpg,cat\r\nb.jpg\r\nc.jpg,dog,extra\r\n"d,1.jpg","dog"\r\ne.jpg,\r\n'
    rows = list(parse_input_list(text, list_uri="/m/list.csv"))
    good = [r for r in rows if isinstance(r, InputFile)]
    dead = [r for r in rows if isinstance(r, DeadLetter)]
    assert [g.filename for g in good] == ["a.jpg", "d,1.jpg"]
    assert sorted(d.uri for d in dead) == ["/m/list.csv:3", "/m/list.csv:4", "/m/list.csv:6"]


def test_a_uri_is_taken_literally_spaces_at_either_end_included(tmp_path):
    for name in ("trail .jpg", " lead.jpg"):
        (tmp_path / name).write_bytes(b"x")
    text = 'uri,label\n"trail .jpg",cat\n" lead.jpg",cat\n'
    rows = list(parse_input_list(text, list_uri=str(tmp_path / "list.csv")))
    assert [(r.filename, r.uri) for r in rows] == [
        ("trail .jpg", str(tmp_path / "trail .jpg")),
        (" lead.jpg", str(tmp_path / " lead.jpg")),
    ]
    assert all(isinstance(r, InputFile) for r in rows)


def test_jsonl_manifest():
    text = '{"uri": "x/1.jpg", "label": "x"}\nnot json\n{"uri": "y/2.jpg"}\n'
    rows = list(parse_input_list(text, list_uri="gs://bucket/m.jsonl"))
    assert rows[0] == InputFile(
        filename="x/1.jpg", uri="gs://bucket/x/1.jpg", label="x", origin="gs://bucket/m.jsonl:1"
    )
    assert [r.reason for r in rows[1:]] == ["bad_manifest_row", "bad_manifest_row"]


def test_csv_without_header_is_a_clear_error():
    with pytest.raises(ValueError, match="header"):
        list(parse_input_list("a.jpg,cat\n", list_uri="m.csv"))


def test_an_unreadable_csv_row_is_a_dead_letter_and_an_empty_part_lists_nothing():
    huge = "b" * (17 << 20)  # over the 16 MiB field limit: csv raises for this row only
    rows = list(parse_input_list(f"uri,label\na.jpg,cat\n{huge}.jpg,dog\nc.jpg,cat\n", list_uri="/m/list.csv"))
    assert [r.filename for r in rows if isinstance(r, InputFile)] == ["a.jpg", "c.jpg"]
    assert [(r.uri, r.reason) for r in rows if isinstance(r, DeadLetter)] == [("/m/list.csv:3", "bad_manifest_row")]
    assert list(parse_input_list("", list_uri="/m/empty.csv")) == []


def test_json_values_that_are_not_text_are_refused_not_printed_into_a_label():
    text = (
        '{"uri": "1.jpg", "label": ["cat"]}\n{"uri": "2.jpg", "label": {"name": "cat"}}\n'
        '{"uri": "3.jpg", "label": true}\n{"uri": "4.jpg", "label": "7"}\n'
    )
    rows = list(parse_input_list(text, list_uri="/m/list.jsonl"))
    assert [(r.uri, r.reason) for r in rows[:3]] == [(f"/m/list.jsonl:{n}", "bad_manifest_row") for n in (1, 2, 3)]
    assert rows[3] == InputFile(filename="4.jpg", uri="/m/4.jpg", label="7", origin="/m/list.jsonl:4")


def test_json_numbers_as_label_uri_or_split_are_bad_rows_that_say_to_write_text():
    """A number would be read as its digits and get the id of its place in text order ('10'
    before '2'), not its value: refused, with the way to write it."""
    text = (
        '{"uri": "photos/coffee/x.jpg", "label": 3}\n{"uri": "1.jpg", "label": 1.5}\n'
        '{"uri": "2.jpg", "label": "cat", "split": 7}\n{"uri": 5, "label": "cat"}\n'
        '{"uri": "3.jpg", "label": "3", "split": "train"}\n'
    )
    rows = list(parse_input_list(text, list_uri="/m/list.jsonl"))
    dead = [r for r in rows if isinstance(r, DeadLetter)]
    assert [(r.uri, r.reason) for r in dead] == [(f"/m/list.jsonl:{n}", "bad_manifest_row") for n in (1, 2, 3, 4)]
    assert dead[0].detail.startswith(
        'label 3 is a JSON number; write it as text ("3"): class ids are the '
        "positions of the sorted label names, so numbers would not keep their values"
    )
    assert dead[1].detail.startswith('label 1.5 is a JSON number; write it as text ("1.5")')
    assert dead[2].detail.startswith('split 7 is a JSON number; write it as text ("7")')
    assert dead[3].detail.startswith('uri 5 is a JSON number; write it as text ("5")')
    assert rows[4] == InputFile(filename="3.jpg", uri="/m/3.jpg", label="3", split="train", origin="/m/list.jsonl:5")

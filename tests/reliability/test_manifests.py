"""Bad manifests and labels: entries outside the root, malformed rows, duplicates, secrets."""

from __future__ import annotations

import json
import shutil

import pytest

from beam_jobs.errors import BadInputError
from beam_jobs.listing.discover import is_image_filename
from beam_jobs.paths import redact, resolve_inside_root
from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli
from tests.dataset_files import dead_letters_path

pytestmark = pytest.mark.slow


def _dead(out) -> list[dict]:
    return [json.loads(line) for line in dead_letters_path(out).read_text().splitlines()]


def _info(out) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


@pytest.fixture()
def layout(tmp_path):
    """root/ holds the manifest and 6 photos; outside/ holds a real photo that must never be read."""
    root = tmp_path / "root"
    photos = make_photo_tree(root / "img", num_images=6, seed=9)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(photos[0], outside / "secret.jpg")
    (root / "img" / "escape.jpg").symlink_to(outside / "secret.jpg")
    return root, photos, outside


@pytest.mark.parametrize(
    "entry",
    [
        "../../etc/passwd",
        "../outside/secret.jpg",
        "/etc/passwd",
        "{outside}/secret.jpg",
        "file://{outside}/secret.jpg",
        "gs://another-bucket/x.jpg",
        "img/\x00.jpg",
        "img/escape.jpg",
    ],
)
def test_entries_outside_the_root_are_refused_before_anything_is_opened(layout, entry):
    root, _, outside = layout
    entry = entry.format(outside=outside)
    with pytest.raises(BadInputError) as caught:
        resolve_inside_root(entry, str(root))
    assert caught.value.reason == "outside_input_root"


def test_the_job_dead_letters_escapes_and_converts_the_rest(layout, tmp_path):
    root, photos, outside = layout
    rows = [{"uri": str(p.relative_to(root)), "label": p.parent.name} for p in photos]
    attacks = [
        "../outside/secret.jpg",
        str(outside / "secret.jpg"),
        f"file://{outside}/secret.jpg",
        "gs://another-bucket/x.jpg",
        "img/a\u0000b.jpg",
        "img/escape.jpg",
        "../../etc/passwd",
    ]
    rows += [{"uri": uri, "label": "evil"} for uri in attacks]
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    run_cli("--manifest", manifest, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.6")
    dead = _dead(out)
    assert len(dead) == len(attacks) and {d["reason"] for d in dead} == {"outside_input_root"}
    assert sorted(d["uri"] for d in dead) == sorted(f"{manifest}:{i}" for i in range(7, 14))
    assert _info(out)["splits"]["train"]["num_examples"] == len(photos)
    assert "evil" not in _info(out)["label_names"]


def test_outside_entries_are_accepted_with_the_opt_in_flag(layout, tmp_path):
    root, photos, outside = layout
    manifest = root / "manifest.csv"
    manifest.write_text(
        f"uri,label\n{outside / 'secret.jpg'},cat\nimg/escape.jpg,cat\n{photos[1].relative_to(root)},dog\n"
    )
    out = tmp_path / "out"
    run_cli("--manifest", manifest, "--output_dir", out, "--image_size", "32", "--allow_outside_root")
    assert _info(out)["splits"]["train"]["num_examples"] == 3 and _dead(out) == []


def test_malformed_csv_rows_are_dead_letters_with_line_numbers(tmp_path):
    root = tmp_path / "root"
    photos = make_photo_tree(root / "img", num_images=4, seed=11)
    rel = [str(p.relative_to(root)) for p in photos]
    quoted = root / "img" / "a,b.jpg"
    shutil.copy(photos[3], quoted)
    lines = [
        "\ufeffuri,label,split",  # 1: a BOM before the header
        f"{rel[0]},cat,train",  # 2: good
        f"{rel[1]}",  # 3: missing columns
        f"{rel[2]},cat,train,extra",  # 4: an extra column
        '"img/a,b.jpg","dog, the good",train',  # 5: good, quoted commas
        f"{rel[2]},",  # 6: empty label
        f"{rel[3]},caf\udce9,train",  # 7: not UTF-8 (latin-1 é)
        f"{rel[2]},bird,validation",  # 8: good
        f"{rel[1]},tab\there,train",  # 9: a control character in the label
        "img/blank.jpg,  ,train",  # 10: a blank label
    ]
    manifest = root / "m.csv"
    manifest.write_bytes("\r\n".join(lines).encode("utf-8", errors="surrogateescape") + b"\r\n")
    out = tmp_path / "out"
    run_cli("--manifest", manifest, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.9")
    # The tab and the blank label break the naming policy shared with tree folders: bad_label.
    assert sorted((d["uri"], d["reason"]) for d in _dead(out)) == [
        (f"{manifest}:{n}", "bad_label" if n in (9, 10) else "bad_manifest_row") for n in (10, 3, 4, 6, 7, 9)
    ]
    info = _info(out)
    assert info["label_names"] == ["bird", "cat", "dog, the good"]
    assert {s: v["num_examples"] for s, v in info["splits"].items()} == {"train": 2, "validation": 1}


@pytest.fixture()
def duplicates(tmp_path):
    root = tmp_path / "root"
    photos = make_photo_tree(root / "img", num_images=4, seed=12)
    shutil.copy(photos[0], root / "img" / "copy_same_label.jpg")
    shutil.copy(photos[1], root / "img" / "copy_other_label.jpg")
    rel = [str(p.relative_to(root)) for p in photos]
    rows = [
        f"{rel[0]},a",
        f"{rel[0]},a",  # the same path twice
        "img/copy_same_label.jpg,a",  # same bytes as rel[0], same label
        f"{rel[1]},b",
        "img/copy_other_label.jpg,c",  # same bytes as rel[1], another label
        f"{rel[2]},a",
        f"{rel[3]},b",
    ]
    manifest = root / "m.csv"
    manifest.write_text("uri,label\n" + "\n".join(rows) + "\n")
    return root, manifest


def test_dedup_path_keeps_copies_but_reports_them(duplicates, tmp_path):
    root, manifest = duplicates
    out = tmp_path / "out"
    run_cli("--manifest", manifest, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.5")
    assert [d["reason"] for d in _dead(out)] == ["duplicate_input"]
    info = _info(out)
    assert info["splits"]["train"]["num_examples"] == 6
    groups = info["content_duplicates"]
    assert len(groups) == 2
    assert sorted(g["conflicting_labels"] for g in groups) == [False, True]


def test_dedup_content_drops_copies_and_refuses_conflicting_labels(duplicates, tmp_path):
    root, manifest = duplicates
    out = tmp_path / "out"
    run_cli(
        "--manifest",
        manifest,
        "--output_dir",
        out,
        "--image_size",
        "32",
        "--dedup",
        "content",
        "--max_bad_fraction",
        "0.6",
    )
    reasons = sorted(d["reason"] for d in _dead(out))
    assert reasons == ["conflicting_labels", "conflicting_labels", "duplicate_content", "duplicate_input"]
    info = _info(out)
    assert info["splits"]["train"]["num_examples"] == 3 and info["content_duplicates"] == []


def test_secrets_in_uris_never_reach_dead_letters_or_logs(tmp_path):
    root = tmp_path / "root"
    photos = make_photo_tree(root / "img", num_images=3, seed=13)
    signed = "https://alice:hunter2@storage.example.com/bucket/x.jpg?X-Amz-Signature=TOPSECRET&X-Amz-Credential=AKIA"
    manifest = root / "m.csv"
    manifest.write_text("uri,label\n" + "".join(f"{p.relative_to(root)},a\n" for p in photos) + f"{signed},a\n")
    out = tmp_path / "out"
    result = run_cli(
        "--manifest",
        manifest,
        "--output_dir",
        out,
        "--image_size",
        "32",
        "--allow_outside_root",
        "--max_bad_fraction",
        "0.5",
    )
    text = dead_letters_path(out).read_text() + result.stdout + result.stderr
    assert len(_dead(out)) == 1
    for secret in ("TOPSECRET", "AKIA", "hunter2", "alice"):
        assert secret not in text
    assert redact(signed) == "https://storage.example.com/bucket/x.jpg?<redacted>"
    assert redact("s3://key:pw@bucket/a.jpg") == "s3://<redacted>@bucket/a.jpg"


@pytest.mark.parametrize(
    "path, image",
    [
        ("s3://imgs/dogs?/x[1].jpg", True),
        ("gs://imgs/dogs#/1.jpg", True),
        ("s3://imgs/cats/a?b.png", True),
        ("/data/dogs?/a#b.jpg", True),
        ("s3://imgs/notes?.txt", False),
        ("https://host/x.jpg?X-Amz-Signature=abc", True),
        ("https://host/x.txt#a.jpg", False),
    ],
)
def test_question_marks_and_hashes_start_a_query_only_in_http_urls(path, image):
    """In a gs://, s3:// or local path "?" and "#" are characters of the name: a listed image
    there must never lose its extension (and be dropped) to a query that is not one."""
    assert is_image_filename(path) is image


def test_redaction_strips_queries_of_http_urls_only():
    assert redact("s3://imgs/dogs?/x.jpg and gs://b/a#1.jpg") == "s3://imgs/dogs?/x.jpg and gs://b/a#1.jpg"
    assert redact("HTTPS://h/x.jpg?sig=1") == "HTTPS://h/x.jpg?<redacted>"
    assert redact("gs://user:pw@b/a?b.jpg") == "gs://<redacted>@b/a?b.jpg"

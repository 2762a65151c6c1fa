"""--plan_only and many-file input lists, through the CLI: a plan in seconds that the full run keeps."""

from __future__ import annotations

import json
import pathlib

import pytest

from beam_jobs.sample_data import make_photo_tree
from tests.conftest import run_cli
from tests.dataset_files import dead_letters, shard_paths

pytestmark = pytest.mark.slow

FLAGS = ["--image_size", "32", "--num_shards", "2", "--splits", "train=0.75,validation=0.25"]


def _json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_plan_only_reads_no_image_and_matches_the_full_run(tmp_path):
    photos = tmp_path / "photos"
    images = make_photo_tree(photos, num_images=16, seed=2)
    rows = ["uri,label"] + [f"{p.relative_to(photos)},{p.parent.name}" for p in images]
    rows += [f"ghost/missing-{i}.jpg,ghost" for i in range(3)]  # files that do not exist
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    result = run_cli("--manifest", photos / "list.csv", "--output_dir", plan_dir, "--plan_only", *FLAGS)
    plan = _json(plan_dir / "plan.json")
    assert sorted(p.name for p in plan_dir.iterdir()) == ["plan.json", "plan_dead_letters.jsonl"]
    assert plan["num_inputs"] == len(images) + 3
    assert sum(s["num_examples"] for s in plan["splits"].values()) == len(images) + 3
    for split in plan["splits"].values():
        assert sum(split["class_counts"].values()) == split["num_examples"]
    assert result.stdout.startswith(f"Found {len(images) + 3} images belonging to {len(plan['label_names'])} classes")
    full = run_cli("--manifest", photos / "list.csv", "--output_dir", out, "--max_bad_fraction", "0.2", *FLAGS)
    assert plan["splits"] == _json(plan_dir / "plan.json")["splits"]
    info = _json(out / "dataset_info.json")
    assert info["dead_letters_by_reason"] == {"read_error": 3}
    for split, facts in info["splits"].items():
        planned = plan["splits"][split]
        assert facts["num_shards"] == planned["num_shards"]
        assert facts["num_examples"] == planned["num_examples"] - planned["class_counts"].get("ghost", 0)
    assert result.stdout.split(";")[0] in full.stderr  # the full run logs the same plan


def test_plan_only_beside_a_dataset_leaves_it_alone(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos, num_images=8, seed=5)
    out = tmp_path / "out"
    run_cli("--input", photos, "--output_dir", out, *FLAGS)
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    run_cli("--input", photos, "--output_dir", out, "--plan_only", *FLAGS)
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if not k.startswith("plan")} == before


def test_an_input_list_in_many_parts_is_one_dataset(tmp_path):
    photos = tmp_path / "photos"
    images = sorted(make_photo_tree(photos, num_images=12, seed=8))
    for part in range(3):
        rows = ["uri,label"] + [f"{p.relative_to(photos)},{p.parent.name}" for p in images[part::3]]
        if part == 1:
            rows.append("not-a-row")
        (photos / f"part-{part}.csv").write_text("\n".join(rows) + "\n")
    parts, single = tmp_path / "parts", tmp_path / "single"
    run_cli("--manifest", photos / "part-*.csv", "--output_dir", parts, "--max_bad_fraction", "0.2", *FLAGS)
    whole = ["uri,label"] + [f"{p.relative_to(photos)},{p.parent.name}" for p in images]
    (photos / "all.csv").write_text("\n".join(whole) + "\n")
    run_cli("--manifest", photos / "all.csv", "--output_dir", single, *FLAGS)
    shards = {p.name: p.read_bytes() for p in shard_paths(single)}
    assert shards and shards == {p.name: p.read_bytes() for p in shard_paths(parts)}
    dead = dead_letters(parts)
    assert [(d["reason"], d["uri"]) for d in dead] == [("bad_manifest_row", f"{photos}/part-1.csv:6")]


def test_parts_in_different_folders_name_one_file_once_and_odd_parts_do_not_stop_the_run(tmp_path):
    photos = tmp_path / "lists"
    images = sorted(make_photo_tree(photos / "img", num_images=6, seed=4))
    (photos / "sub").mkdir()
    rows = ["uri,label"] + [f"img/{p.relative_to(photos / 'img')},{p.parent.name}" for p in images]
    (photos / "part-1.csv").write_text("\n".join(rows) + "\n")
    # The same first file again, from a part one folder down; a huge field; an empty part.
    (photos / "sub" / "part-2.csv").write_text(
        f"uri,label\n../img/{images[0].relative_to(photos / 'img')},{images[0].parent.name}\n"
        f"img/{'a' * 200_000}.jpg,x\n"
    )
    (photos / "sub" / "part-3.csv").write_text("")
    out = tmp_path / "out"
    run_cli("--manifest", f"{photos}/**part-*.csv", "--output_dir", out, "--max_bad_fraction", "0.5", *FLAGS)
    info = _json(out / "dataset_info.json")
    assert sum(s["num_examples"] for s in info["splits"].values()) == len(images)
    assert info["content_duplicates"] == []
    assert info["dead_letters_by_reason"] == {"duplicate_input": 1, "read_error": 1}  # the long name


def test_a_plan_that_cannot_succeed_says_so_and_a_full_run_replaces_it(tmp_path):
    photos = tmp_path / "photos"
    make_photo_tree(photos / "train", num_images=4, seed=6)
    plan_dir = tmp_path / "out"
    result = run_cli("--input", photos, "--output_dir", plan_dir, "--plan_only", "--tree_layout", "label", check=False)
    assert result.returncode == 1 and "no input can become an example" in result.stderr
    assert _json(plan_dir / "plan.json")["would_fail"].startswith("no input can become an example")
    run_cli("--input", photos, "--output_dir", plan_dir, *FLAGS)
    assert not (plan_dir / "plan.json").exists() and not (plan_dir / "plan_dead_letters.jsonl").exists()


def test_a_plan_of_a_flat_folder_gives_the_full_runs_fix(tmp_path):
    """Images not in class folders: the plan refuses them with the same fix the full run gives."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for image in make_photo_tree(tmp_path / "tree", num_images=6, seed=4):
        image.rename(flat / f"{image.parent.name}-{image.name}")
    plan = run_cli("--input", flat, "--output_dir", tmp_path / "plan", "--plan_only", *FLAGS, check=False)
    full = run_cli("--input", flat, "--output_dir", tmp_path / "out", *FLAGS, check=False)
    assert plan.returncode == 1 and full.returncode == 1
    fix = "images must sit in one folder per class (ROOT/<label>/<image>, or ROOT/<split>/<label>/<image>)"
    assert fix in full.stderr  # the full run's own words, which the plan must repeat
    errors = [line for line in plan.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "main reasons: unexpected_layout 6" in errors[0] and fix in errors[0], plan.stderr
    assert fix in _json(tmp_path / "plan" / "plan.json")["would_fail"]


def test_a_list_whose_literal_name_is_also_a_pattern_is_read_alone_with_a_warning(tmp_path):
    photos = tmp_path / "photos"
    images = make_photo_tree(photos, num_images=4, seed=5)
    rows = "uri,label\n" + "".join(f"{p.relative_to(photos)},{p.parent.name}\n" for p in images)
    (photos / "part-[1].csv").write_text(rows)  # the list the user named
    (photos / "part-1.csv").write_text(rows.replace(",", ",other_", 1) + "ghost.jpg,x\n")  # what "[1]" matches
    out = tmp_path / "plan"
    result = run_cli("--manifest", photos / "part-[1].csv", "--output_dir", out, "--plan_only", *FLAGS)
    assert _json(out / "plan.json")["num_inputs"] == 4
    assert "is read alone" in result.stderr and "part-1.csv" in result.stderr

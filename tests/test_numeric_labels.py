"""Labels that look like numbers: the plan's warning is the same from a tree and from a list, in
the in-memory plan and in PlanShards."""

from __future__ import annotations

import json
import shutil

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.planning.rules import labels_from_tree, plan_dataset
from beam_jobs.planning.transforms import PLAN_SUMMARY, PlanShards
from beam_jobs.records import InputFile

_WARNING = (
    "labels look like numbers but ids follow sorted text order ('10' has id 2); "
    "dataset_info.json's label_names maps ids to names (Keras does the same); "
    "name them 00, 01, ... to keep numeric order"
)


@pytest.mark.parametrize("from_tree", [True, False])
def test_numeric_labels_out_of_order_warn_alike_in_memory_and_in_plan_shards(from_tree):
    if from_tree:
        listing = [InputFile(f"{n}/{i}.jpg", f"/t/{n}/{i}.jpg") for n in range(12) for i in range(3)]
        labelled, dead = labels_from_tree(listing, "auto")
    else:
        listing = [
            InputFile(f"{n}/{i}.jpg", f"/t/{n}/{i}.jpg", label=str(n), origin=f"/t/list.csv:{3 * n + i + 2}")
            for n in range(12)
            for i in range(3)
        ]
        labelled, dead = listing, []
    settings = dict(split_fractions=None, num_shards=2, example_bytes=1, target_shard_bytes=1, dedup="path")
    expected = plan_dataset(labelled, dead_letters=dead, **settings)
    assert _WARNING in expected.warnings
    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        planned = (
            p | beam.Create(listing) | PlanShards(from_tree=from_tree, tree_layout="auto", source="/t", **settings)
        )
        assert_that(
            planned[PLAN_SUMMARY] | beam.Map(lambda s: (tuple(s["label_names"]), tuple(s["warnings"]))),
            equal_to([(expected.label_names, expected.warnings)]),
        )


@pytest.mark.slow
def test_a_tree_of_numbered_class_folders_plans_with_the_warning(tmp_path):
    from beam_jobs.sample_data import make_photo_tree
    from tests.conftest import run_cli

    photo = make_photo_tree(tmp_path / "source", num_images=1, size=(40, 30), seed=3)[0]
    root = tmp_path / "root"
    for n in range(12):
        (root / str(n)).mkdir(parents=True)
        shutil.copy(photo, root / str(n) / f"{n}.jpg")
    plan_dir = tmp_path / "plan"
    result = run_cli("--input", root, "--output_dir", plan_dir, "--image_size", "32", "--plan_only")
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert plan["label_names"][:5] == ["0", "1", "10", "11", "2"]
    assert _WARNING in plan["warnings"]
    assert _WARNING in result.stdout + result.stderr

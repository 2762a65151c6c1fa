"""The job's transforms under Beam's TestPipeline, on the FnApiRunner (no download, in process)."""

from __future__ import annotations

import json
import os

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.config import ImageConfig
from beam_jobs.listing.discover import ListTree
from beam_jobs.pipeline import ConvertImages
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import InputFile
from beam_jobs.writing.convert_shards import DEAD_LETTERS, ConvertShardFn


def _pipeline() -> TestPipeline:
    return TestPipeline(runner=FnApiRunner(), blocking=True)


def test_list_tree_finds_images_only(photo_tree):
    root, good, broken = photo_tree
    expected = sorted(str(p.relative_to(root)) for p in [*good, *map(type(root), broken)])
    with _pipeline() as p:
        names = p | ListTree(str(root)) | beam.Map(lambda f: f.filename)
        assert_that(names, equal_to(expected))


def test_convert_shard_writes_one_complete_file_and_dead_letters(photo_tree, tmp_path):
    root, good, broken = photo_tree
    inputs = [InputFile(str(p.relative_to(root)), str(p), label=p.parent.name) for p in good[:6]]
    inputs += [InputFile(str(type(root)(p).relative_to(root)), p, label="chelsea") for p in broken]
    plan = plan_dataset(inputs, num_shards=1, example_bytes=1)
    with _pipeline() as p:
        outputs = (
            p
            | beam.Create(plan.shards)
            | beam.ParDo(ConvertShardFn(ImageConfig(width=32, height=32), str(tmp_path))).with_outputs(
                DEAD_LETTERS, main="shards"
            )
        )
        assert_that(
            outputs.shards | beam.Map(lambda r: (r.file, r.num_examples)),
            equal_to([("train-00000-of-00001.tfrecord", 6)]),
            label="CheckShards",
        )
        assert_that(
            outputs[DEAD_LETTERS] | beam.Map(lambda d: (d.uri, d.reason)),
            equal_to(sorted(broken.items())),
            label="CheckDeadLetters",
        )
    # No temp file left behind: one complete shard under its final name in the (run) folder it was
    # given, and its sidecar, which lets --resume trust it and --append know its inputs.
    assert sorted(os.listdir(tmp_path)) == [".train-00000-of-00001.tfrecord.json", "train-00000-of-00001.tfrecord"]


def test_convert_images_writes_the_manifest(photo_tree, tmp_path):
    root, good, broken = photo_tree
    with _pipeline() as p:
        info = p | ConvertImages(
            input_root=str(root),
            input_list=None,
            output_dir=str(tmp_path),
            image_config=ImageConfig(width=32, height=24, encoding="png"),
            split_fractions={"train": 0.75, "validation": 0.25},
            num_shards=2,
            target_shard_bytes=2**20,
            max_bad_fraction=0.5,
            settings={},
        )
        assert_that(
            info | beam.Map(lambda i: sum(s["num_examples"] for s in i["splits"].values())), equal_to([len(good)])
        )
    written = json.loads((tmp_path / "dataset_info.json").read_text())
    assert set(written["splits"]) == {"train", "validation"}
    assert written["image"] == {"height": 24, "width": 32, "channels": 3, "format": "PNG"}
    assert written["num_dead_letters"] == len(broken)

"""ConversionSpec: one typed description of a conversion, made the same way from argv and from
keywords, that validates itself and names the bad value."""

from __future__ import annotations

import dataclasses

import pytest

from beam_jobs.api import spec_from_keywords
from beam_jobs.command_line.arguments import parse_job_arguments, runner_args_of
from beam_jobs.config import ImageConfig
from beam_jobs.errors import UsageError
from beam_jobs.spec import ConversionSpec, Limits, RunMode, ShardSpec, Source, SplitSpec


def test_the_command_line_and_the_keywords_build_equal_specs():
    from_line, options = parse_job_arguments(
        [
            "--input",
            "/data/photos",
            "--output_dir=/data/out",
            "--splits",
            "train=0.8,test=0.2",
            "--image_size",
            "64x48",
            "--encoding=png",
            "--num_shards",
            "3",
            "--append",
            "--changed_sources",
            "keep",
            "--direct_num_workers",
            "2",
            "-v",
        ]
    )
    from_call, call_options = spec_from_keywords(
        {
            "input": "/data/photos",
            "output_dir": "/data/out",
            "splits": {"train": 0.8, "test": 0.2},
            "image_size": (64, 48),
            "encoding": "png",
            "num_shards": 3,
            "append": True,
            "changed_sources": "keep",
            "log_level": "info",
        },
        {"direct_num_workers": 2},
    )
    assert from_call == from_line
    assert from_line.image == ImageConfig(width=64, height=48, encoding="png")
    assert from_line.splits.fractions == {"train": 0.8, "test": 0.2}
    assert from_line.shards.num_shards == 3
    assert from_line.mode == RunMode(append=True, changed_sources="keep")
    assert from_line.log_level == "INFO"
    # Beam's options travel beside the conversion, never mixed with the job's flags.
    assert from_line.runner_args == ("--direct_num_workers", "2")
    assert from_call.runner_args == ("--direct_num_workers=2",)
    assert options.get_all_options()["direct_num_workers"] == call_options.get_all_options()["direct_num_workers"] == 2


def test_runner_args_keep_beams_flags_and_drop_the_jobs_with_their_values():
    argv = ["--input", "/p", "--runner", "FlinkRunner", "--output_dir=/o", "--overwrite", "--flink_master=h:8081"]
    assert runner_args_of(argv) == ("--runner", "FlinkRunner", "--flink_master=h:8081")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Source(), "exactly one of root"),
        (lambda: Source(root="/a", input_list="/b.csv"), "exactly one of root"),
        (lambda: Source(input_list="/b.csv", coco_files=((None, "/c.json"),)), "give --input too"),
        (lambda: Source(root="/a", dedup="bytes"), "--dedup must be one of path, content (got 'bytes')"),
        (lambda: SplitSpec(fractions={"train": 0.5}), "must sum to 1"),
        (lambda: SplitSpec(fractions={"train": 1.0}, rule="random"), "--split_rule must be one of"),
        (lambda: ShardSpec(num_shards=-1), "--num_shards must be >= 0 (0: derived from --target_shard_mb) (got -1)"),
        (lambda: ShardSpec(target_shard_mb=0.0), "--target_shard_mb must be a finite number >= 0.01"),
        (lambda: Limits(max_bad_fraction=1.5), "--max_bad_fraction must be a finite number >= 0.0 and <= 1.0"),
        (lambda: RunMode(append=True, overwrite=True), "at most one of --append"),
        (lambda: RunMode(append=True, relabel="sorted"), "--relabel sorted renumbers"),
        (lambda: RunMode(append=True, plan_only=True), "--plan_only plans a first version, not what --append"),
        (lambda: RunMode(keep_versions=0), "--keep_versions must be >= 1"),
        (lambda: ConversionSpec(source=Source(root="/a"), output_dir=""), "--output_dir is required"),
        (lambda: ConversionSpec(source=Source(root="/a"), output_dir="/o", log_level="LOUD"), "--log_level"),
    ],
)
def test_each_part_validates_itself_and_names_the_bad_value(build, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        build()


def test_a_spec_is_frozen_and_replace_validates_again():
    spec = ConversionSpec(source=Source(root="/a"), output_dir="/o")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.output_dir = "/elsewhere"  # type: ignore[misc]
    assert spec.replace(mode=RunMode(resume=True)).mode.resume
    with pytest.raises(UsageError, match="--output_dir is required"):
        spec.replace(output_dir="")


def test_the_settings_the_fingerprint_hashes_are_the_same_however_the_spec_was_made():
    from_line, _ = parse_job_arguments(["--input", "/p", "--output_dir", "/o", "--splits", "train=0.9,validation=0.1"])
    direct = ConversionSpec(
        source=Source(root="/p"), output_dir="/o", splits=SplitSpec(fractions={"train": 0.9, "validation": 0.1})
    )
    assert direct.settings == from_line.settings
    assert from_line.settings == {
        "splits": {"train": 0.9, "validation": 0.1},
        "split_rule": "stratified",
        "num_shards": None,
        "target_shard_mb": 150,
        "dedup": "path",
    }


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"jpeg_quality": 9.5}, "jpeg_quality must be an integer (got 9.5)"),
        ({"encoding": "webp"}, "encoding must be one of 'jpeg', 'png', 'raw' (got 'webp')"),
        ({"max_bad_fraction": "lots"}, "max_bad_fraction: 'lots' is not a valid value"),
        ({"splits": {"train": 0.7}}, "must sum to 1"),
    ],
)
def test_keywords_are_checked_against_their_flags_declaration(keywords, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        spec_from_keywords({"input": "/p", "output_dir": "/o", **keywords})


def test_beam_options_may_not_carry_the_jobs_own_flags():
    with pytest.raises(UsageError, match="image_size is convert\\(\\)'s own keyword"):
        spec_from_keywords({"input": "/p", "output_dir": "/o"}, {"image_size": 64})


def test_a_spec_part_takes_each_field_from_the_flag_of_its_name_and_never_defaults_one_silently():
    from beam_jobs.spec import _part_from_flags  # pylint: disable=import-outside-toplevel

    flags = {"overwrite": False, "append": True, "resume": False, "plan_only": False}
    flags |= {"changed_sources": "keep", "relabel": "keep", "keep_versions": 3}
    assert _part_from_flags(RunMode, flags) == RunMode(append=True, changed_sources="keep", keep_versions=3)

    @dataclasses.dataclass(frozen=True)
    class WithANewField:
        overwrite: bool = False
        a_field_without_a_flag: int = 7

    with pytest.raises(KeyError, match="a_field_without_a_flag"):
        _part_from_flags(WithANewField, flags)
    assert _part_from_flags(WithANewField, flags, a_field_without_a_flag=1) == WithANewField(False, 1)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ShardSpec(num_shards=2.5), "ShardSpec.num_shards must be a whole number or None .got 2.5."),
        (lambda: ShardSpec(num_shards="3"), "ShardSpec.num_shards must be a whole number or None .got '3'."),
        (lambda: RunMode(overwrite="no"), "RunMode.overwrite must be True or False .got 'no'."),
        (lambda: RunMode(keep_versions=1.5), "RunMode.keep_versions must be a whole number"),
        (lambda: ImageConfig(width=64.5), "ImageConfig.width must be a whole number .got 64.5."),
        (lambda: ImageConfig(jpeg_quality=True), "ImageConfig.jpeg_quality must be a whole number .got True."),
        (lambda: ImageConfig(decode_timeout_s=float("nan")), "decode_timeout_s must be > 0 and at most 86400"),
        (lambda: Source(root=123), "Source.root must be a string or None .got 123."),
        (lambda: Source(root=""), "Source.root must be a path, not an empty string"),
        (lambda: Source(root="/a", coco_masks="yes"), "Source.coco_masks must be True or False"),
        (lambda: SplitSpec(fractions="train=1"), "SplitSpec.fractions must be a mapping from a string to a number"),
        (lambda: ConversionSpec(source="photos", output_dir="/o"), "ConversionSpec.source must be a Source"),
        (lambda: ConversionSpec(source=Source(root="/a"), output_dir=42), "ConversionSpec.output_dir must be a string"),
        (
            lambda: ConversionSpec(source=Source(root="/a"), output_dir="/o", runner_args="--x=1"),
            "ConversionSpec.runner_args must be a tuple, each item a string",
        ),
    ],
)
def test_each_part_refuses_a_value_of_the_wrong_type_by_the_fields_name(make, message):
    with pytest.raises(UsageError, match=message):
        make()


def test_a_made_spec_cannot_be_changed_and_is_a_hashable_value(tmp_path, monkeypatch):
    import os  # pylint: disable=import-outside-toplevel
    import pathlib  # pylint: disable=import-outside-toplevel
    import pickle  # pylint: disable=import-outside-toplevel

    monkeypatch.chdir(tmp_path)
    spec = ConversionSpec(
        source=Source(root=pathlib.Path("photos"), coco_files=(("train", "a.json"),)),
        output_dir="out",
        splits=SplitSpec(fractions={"train": 0.5, "validation": 0.5}),
    )
    assert spec.source.root == os.path.join(tmp_path, "photos") and spec.output_dir == os.path.join(tmp_path, "out")
    assert spec.source.coco_files == (("train", os.path.join(tmp_path, "a.json")),)
    assert spec.splits.fractions == {"train": 0.5, "validation": 0.5}
    with pytest.raises(TypeError):
        spec.splits.fractions["Hold Out!"] = 0.5  # type: ignore[index]
    assert spec.settings["splits"] == {"train": 0.5, "validation": 0.5}
    assert pickle.loads(pickle.dumps(spec)) == spec and {spec: 1}[pickle.loads(pickle.dumps(spec))] == 1
    assert spec.replace(output_dir="elsewhere").output_dir == os.path.join(tmp_path, "elsewhere")


def test_one_value_has_one_form_so_equal_settings_make_one_run_fingerprint():
    from beam_jobs.writing.dataset_info import run_fingerprint  # pylint: disable=import-outside-toplevel

    default, _ = parse_job_arguments(["--input", "/p", "--output_dir", "/o"])
    explicit, _ = parse_job_arguments(["--input", "/p", "--output_dir", "/o", "--target_shard_mb", "150"])
    keywords, _ = spec_from_keywords({"input": "/p", "output_dir": "/o", "decode_timeout_s": 60})
    prints = {run_fingerprint(spec.image, spec.settings) for spec in (default, explicit, keywords)}
    assert len(prints) == 1
    assert default.shards.target_shard_mb == 150 and isinstance(default.shards.target_shard_mb, int)
    assert SplitSpec(fractions={"train": 1}).fractions == {"train": 1.0}
    assert ShardSpec(target_shard_mb=0.5).target_shard_mb == 0.5


def test_flag_rules_hold_for_parts_made_directly():
    with pytest.raises(UsageError, match="at most 86400 seconds"):
        ImageConfig(decode_timeout_s=1e10)
    assert Source(root="/a", coco_files=(("Train", "/a.json"),)).coco_files == (("train", "/a.json"),)
    with pytest.raises(UsageError, match="the split 'no such/split!' cannot name shard files"):
        Source(root="/a", coco_files=(("no such/split!", "/a.json"),))
    with pytest.raises(UsageError, match="names no bucket"):
        ConversionSpec(source=Source(root="/a"), output_dir="gs://")
    with pytest.raises(UsageError, match="cannot name shard files"):
        parse_job_arguments(["--input", "/p", "--output_dir", "/o", "--coco_annotations", "bad!=/x.json"])

"""Tests of the manifest loader, the step helpers and ReadConfig validation."""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest
import tensorflow as tf

import tfdata_readers
from tfdata_readers.config import ReadConfig


def test_load_manifest_reads_format(jpeg_dir: pathlib.Path) -> None:
    info = tfdata_readers.load_manifest(jpeg_dir)
    assert (info.image.height, info.image.width, info.image.channels, info.image.format) == (32, 32, 3, "JPEG")
    train = info.split("train")
    assert train.num_examples == 50
    assert [pathlib.Path(s.path).name for s in train.shards] == [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert sum(s.num_examples for s in train.shards) == 50


@pytest.mark.parametrize(
    "split, batch, drop, expected",
    [
        ("train", 8, True, 6),
        ("train", 8, False, 7),
        ("train", 50, True, 1),
        ("validation", 5, False, 3),
        ("validation", 13, True, 1),
        ("validation", 14, True, 0),
    ],
)
def test_steps_per_epoch(jpeg_dir: pathlib.Path, split: str, batch: int, drop: bool, expected: int) -> None:
    assert tfdata_readers.steps_per_epoch(jpeg_dir, split, batch, drop_remainder=drop) == expected


def test_num_examples(jpeg_dir: pathlib.Path) -> None:
    assert tfdata_readers.num_examples(jpeg_dir, "train") == 50
    assert tfdata_readers.num_examples(jpeg_dir, "validation") == 13


def test_unknown_split_names_the_choices(jpeg_dir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"'test'.*\['train', 'validation'\]"):
        tfdata_readers.num_examples(jpeg_dir, "test")


def _copy_with_manifest(src: pathlib.Path, dst: pathlib.Path, edit) -> pathlib.Path:
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "dataset_info.json").read_text())
    edit(manifest)
    (dst / "dataset_info.json").write_text(json.dumps(manifest))
    return dst


def test_newer_schema_is_refused(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    d = _copy_with_manifest(jpeg_dir, tmp_path / "d", lambda m: m.update(schema_version=3))
    with pytest.raises(ValueError, match="schema_version 3"):
        tfdata_readers.load_manifest(d)


def test_inconsistent_counts_are_refused(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    d = _copy_with_manifest(jpeg_dir, tmp_path / "d", lambda m: m["splits"]["train"].update(num_examples=51))
    with pytest.raises(ValueError, match="num_examples is 51 but its shards hold 50"):
        tfdata_readers.load_manifest(d)


def test_missing_manifest_names_the_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset_info.json"):
        tfdata_readers.load_manifest(tmp_path)


def test_declared_dtype_must_match(jpeg_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    d = _copy_with_manifest(
        jpeg_dir, tmp_path / "d", lambda m: m["features"].update({"image/class/label": {"dtype": "string"}})
    )
    with pytest.raises(ValueError, match="image/class/label"):
        tfdata_readers.make_dataset(d, "train", 4)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cycle_length", 0, "cycle_length"),
        ("cycle_length", tf.data.AUTOTUNE, "cycle_length"),
        ("block_length", 0, "block_length"),
        ("shuffle_buffer_size", -5, r"shuffle_buffer_size.*-5"),
        ("num_parallel_calls", 0, "num_parallel_calls"),
        ("num_parallel_reads", "8", "num_parallel_reads"),
        ("prefetch", -2, "prefetch"),
        ("decode_placement", "gpu", "'gpu'"),
        ("image_size", (0, 10), "image_size"),
        ("scale", -1.0, "scale"),
        ("dtype", "float16", "'float16'"),
        ("crop_area_range", (0.0, 1.0), "crop_area_range"),
        ("crop_area_range", (0.5, 0.2), "crop_area_range"),
        ("crop_aspect_ratio_range", (2.0, 1.0), "crop_aspect_ratio_range"),
        ("object_crop_area_range", (0.5, 1.5), "object_crop_area_range"),
        ("num_epochs", 0, "num_epochs"),
        ("drop_remainder", "yes", "drop_remainder"),
        # Values of the wrong type: a named ValueError, never a TypeError from deep inside.
        ("image_size", "32", r"ReadConfig\.image_size.*'32'"),
        ("image_size", (32, 32, 3), r"ReadConfig\.image_size.*\(32, 32, 3\)"),
        ("image_size", 0, r"ReadConfig\.image_size.*got 0"),
        ("image_size", 32.0, r"ReadConfig\.image_size.*32\.0"),
        ("scale", "0.5", r"ReadConfig\.scale.*'0\.5'"),
        ("crop_area_range", 0.5, r"ReadConfig\.crop_area_range.*0\.5"),
        ("crop_aspect_ratio_range", None, r"ReadConfig\.crop_aspect_ratio_range.*None"),
        ("deterministic", "yes", r"ReadConfig\.deterministic.*'yes'"),
        ("shuffle_files", 1, r"ReadConfig\.shuffle_files.*1"),
        ("skip_corrupt", "no", r"ReadConfig\.skip_corrupt.*'no'"),
        ("num_epochs", True, r"ReadConfig\.num_epochs.*True"),
        # Only finite numbers: inf or nan would give inf pixels or a crop that can never be drawn.
        ("scale", float("inf"), r"ReadConfig\.scale must be None or a finite number.*inf"),
        ("scale", float("nan"), r"ReadConfig\.scale.*nan"),
        ("crop_area_range", (0.5, float("inf")), r"ReadConfig\.crop_area_range must be finite.*inf"),
        ("crop_area_range", (float("nan"), 1.0), r"ReadConfig\.crop_area_range.*nan"),
        ("crop_aspect_ratio_range", (0.75, float("inf")), r"ReadConfig\.crop_aspect_ratio_range must be finite.*inf"),
        ("crop_aspect_ratio_range", (-float("inf"), 1.0), r"ReadConfig\.crop_aspect_ratio_range.*-inf"),
        # None, True or False themselves: 1 == True and 0.0 == False are not bools.
        ("deterministic", 1, r"ReadConfig\.deterministic must be None, True or False \(got 1\)"),
        ("deterministic", 1.0, r"ReadConfig\.deterministic.*1\.0"),
        ("deterministic", 0.0, r"ReadConfig\.deterministic.*0\.0"),
        ("drop_remainder", 1, r"ReadConfig\.drop_remainder must be None, True or False \(got 1\)"),
        ("drop_remainder", 0.0, r"ReadConfig\.drop_remainder.*0\.0"),
    ],
)
def test_config_rejects_bad_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadConfig(**{field: value})


@pytest.mark.parametrize("value", [32, (32, 32), [32, 32]])
def test_image_size_takes_an_int_for_a_square(value: object) -> None:
    assert ReadConfig(image_size=value).image_size == (32, 32)


def test_make_dataset_resizes_to_an_int_image_size(jpeg_dir: pathlib.Path) -> None:
    """As the converter's --image_size 24: one int is a square."""
    for training in (False, True):
        image, _ = next(
            iter(tfdata_readers.make_dataset(jpeg_dir, "train", 4, image_size=24, training=training, seed=0))
        )
        assert image.shape == (4, 24, 24, 3)


def test_uint8_output_refuses_a_scale_it_cannot_apply() -> None:
    assert ReadConfig(dtype="uint8").dtype == "uint8"  # the default scale is implied by 0-255
    assert ReadConfig(dtype="uint8", scale=None).scale is None
    with pytest.raises(ValueError, match=r"dtype='uint8'.*scale=2\.0"):
        ReadConfig(dtype="uint8", scale=2.0)


def test_config_defaults_are_valid_and_frozen() -> None:
    config = ReadConfig()
    assert config.num_parallel_reads == tf.data.AUTOTUNE and config.deterministic is None
    # None: evaluation and seeded training are deterministic; unseeded training may reorder for speed.
    assert config.resolved_deterministic(0, training=True) is True
    assert config.resolved_deterministic(None, training=True) is False
    assert config.resolved_deterministic(None, training=False) is True
    with pytest.raises(AttributeError):
        config.block_length = 4  # type: ignore[misc]


def test_unknown_option_is_named(jpeg_dir: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="shuffle_bufer"):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, shuffle_bufer=10)


_BAD_BATCH_SIZES = [True, False, 0, -4, 2.5, 4.0, "4", None]


@pytest.mark.parametrize("value", _BAD_BATCH_SIZES, ids=repr)
def test_batch_sizes_must_be_positive_ints(jpeg_dir: pathlib.Path, value: object) -> None:
    """A bool is not a batch size (True would be a batch of 1); 2.5 gave 20.0 steps, "4" a TypeError."""
    with pytest.raises(ValueError, match=rf"^batch_size must be a positive int \(got {re.escape(repr(value))}\)"):
        tfdata_readers.make_dataset(jpeg_dir, "train", value)
    with pytest.raises(
        ValueError, match=rf"^global_batch_size must be a positive int \(got {re.escape(repr(value))}\)"
    ):
        tfdata_readers.steps_per_epoch(jpeg_dir, "train", value)
    with pytest.raises(
        ValueError, match=rf"^global_batch_size must be a positive int \(got {re.escape(repr(value))}\)"
    ):
        tfdata_readers.distribute(tf.distribute.get_strategy(), jpeg_dir, "train", value)


@pytest.mark.parametrize("seed", [True, False, -1, 2**63, 1.5, "a", 3.0], ids=repr)
def test_seed_must_be_an_int_in_range(jpeg_dir: pathlib.Path, seed: object) -> None:
    with pytest.raises(
        ValueError, match=rf"^seed must be None or an int with 0 <= seed < 2\*\*63 \(got {re.escape(repr(seed))}\)"
    ):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, training=True, seed=seed)


def test_the_largest_seed_is_accepted(jpeg_dir: pathlib.Path) -> None:
    """2**63 - 1 is valid, also for the pipelines whose per-pipeline seed is offset from it."""
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    image, _ = next(
        iter(
            tfdata_readers.make_dataset(
                jpeg_dir,
                "train",
                4,
                training=True,
                seed=2**63 - 1,
                input_context=context,
            )
        )
    )
    assert image.shape == (4, 32, 32, 3)

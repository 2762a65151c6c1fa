"""Flag parsing and configuration validation: bad values are named in the error."""

from __future__ import annotations

import pytest

from beam_jobs.config import ImageConfig, parse_image_size, parse_splits


@pytest.mark.parametrize("text, expected", [("224", (224, 224)), ("256x192", (256, 192)), ("64X32", (64, 32))])
def test_image_size(text, expected):
    assert parse_image_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-3", "axb", "1x2x3", "224x"])
def test_bad_image_size_names_the_value(text):
    with pytest.raises(ValueError, match="image_size"):
        parse_image_size(text)


def test_splits():
    assert parse_splits("train=0.9,validation=0.1") == {"train": 0.9, "validation": 0.1}


@pytest.mark.parametrize("text", ["train=0.5", "train", "train=0.5,train=0.5", "=1", "train=x", "a/b=1"])
def test_bad_splits_name_the_value(text):
    with pytest.raises(ValueError, match="--splits"):
        parse_splits(text)


@pytest.mark.parametrize(
    "field, value",
    [("channels", 2), ("resize_mode", "squash"), ("encoding", "gif"), ("jpeg_quality", 0), ("width", 0)],
)
def test_image_config_validates_itself(field, value):
    with pytest.raises(ValueError, match=repr(value) if isinstance(value, str) else str(value)):
        ImageConfig(**{field: value})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train=0.8,hold-out=0.2", {"train": 0.8, "hold-out": 0.2}),
        ("Train=0.9,Validation=0.1", {"train": 0.9, "validation": 0.1}),
        (" train = 0.5 , dev_1 = 0.5 ", {"train": 0.5, "dev_1": 0.5}),
    ],
)
def test_split_names_follow_the_split_name_policy(text, expected):
    # The names tree folders and input-list columns may use, in lower case, as they are there.
    assert parse_splits(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("train=1,test=0", "the fraction of 'test' must be > 0 and <= 1 (got '0'"),
        ("train=1.5", "the fraction of 'train' must be > 0 and <= 1 (got '1.5'"),
        ("train=nan", "the fraction of 'train' must be > 0 and <= 1 (got 'nan'"),
        ("train=x", "the fraction of 'train' must be a number such as 0.9 (got 'x'"),
        ("train=0.5,Train=0.5", "names 'train' twice"),
        ("a.b=1", "the split 'a.b' cannot name shard files"),
    ],
)
def test_a_bad_split_item_gets_a_message_naming_what_is_wrong(text, message):
    with pytest.raises(ValueError, match="--splits") as error:
        parse_splits(text)
    assert message in str(error.value)


def test_the_default_output_size_is_224_square_the_reference_models_input():
    assert (ImageConfig().width, ImageConfig().height) == (224, 224)

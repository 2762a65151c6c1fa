"""`class_counts` refuses a manifest that predates class counts, and only it does."""

from __future__ import annotations

import json

import pytest

import tfdata_readers as tfr


def test_an_old_manifest_gets_a_clear_error_from_class_counts_only(jpeg_dir):
    with pytest.raises(ValueError, match="did not record them; rerun the conversion"):
        tfr.class_counts(jpeg_dir, "train")
    assert tfr.num_examples(jpeg_dir, "train") == 50  # everything else still reads it
    next(iter(tfr.make_dataset(jpeg_dir, "train", 8)))


def test_counts_must_cover_every_label_and_add_up(jpeg_dir, tmp_path):
    info = json.loads((jpeg_dir / "dataset_info.json").read_text())
    copy = tmp_path / "data"
    copy.mkdir()
    names = info["label_names"]
    info["splits"]["train"]["class_counts"] = {name: 0 for name in names} | {names[0]: 50}
    (copy / "dataset_info.json").write_text(json.dumps(info))
    assert tfr.class_counts(copy, "train") == {0: 50} | {i: 0 for i in range(1, len(names))}
    info["splits"]["train"]["class_counts"] = {names[0]: 49}
    (copy / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="a count >= 0 for each of label_names"):
        tfr.class_counts(copy, "train")
    info["splits"]["train"]["class_counts"] = {name: 0 for name in names} | {names[0]: 49}
    (copy / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="add up to 49 but num_examples is 50"):
        tfr.class_counts(copy, "train")

"""The reader refuses storage TensorFlow cannot open with one clear error, not a TensorFlow one."""

from __future__ import annotations

import pytest

import tfdata_readers as tfr
from tfdata_readers.sources.schemes import check_readable_location


@pytest.mark.parametrize("data_dir", ["s3://imgs/out", "S3://imgs/out", "s3a://imgs/out"])
def test_s3_is_refused_naming_the_alternatives(data_dir):
    with pytest.raises(ValueError) as raised:
        tfr.make_dataset(data_dir, "train", 4)
    message = str(raised.value)
    assert message.startswith(f"cannot read {data_dir}: TensorFlow ")
    assert "no s3" in message and "copy the dataset to local disk" in message and "gs://" in message
    assert "mount" in message


def test_verify_refuses_s3_too():
    with pytest.raises(ValueError, match=r"^cannot read s3://imgs/out: "):
        tfr.verify("s3://imgs/out")


def test_an_unknown_scheme_names_what_tensorflow_reads():
    with pytest.raises(ValueError, match=r"has no hdfs:// filesystem \(it reads .*gs://.* and local paths\)"):
        tfr.load_manifest("hdfs://namenode/out")


@pytest.mark.parametrize("data_dir", ["/data/out", "relative/out", "gs://bucket/out", "file:///data/out", "ram://x"])
def test_readable_locations_pass(data_dir):
    check_readable_location(data_dir)

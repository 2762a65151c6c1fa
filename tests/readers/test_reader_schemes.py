"""The reader refuses storage it cannot open with one clear error, not a TensorFlow one."""

from __future__ import annotations

import pytest

import tfdata_readers as tfr
from tfdata_readers.sources.schemes import check_readable_location


@pytest.mark.parametrize("data_dir", ["s3://imgs/out", "S3://imgs/out", "s3a://imgs/out"])
def test_s3_without_a_cache_is_refused_naming_it(data_dir):
    with pytest.raises(ValueError, match=rf"^cannot read {data_dir} without a cache: .*ReadConfig\(cache_dir="):
        tfr.make_dataset(data_dir, "train", 4)


def test_an_unknown_scheme_names_what_tensorflow_reads():
    with pytest.raises(
        ValueError, match=r"has no hdfs:// filesystem \(the reader reads .*gs://.*s3://.* and local paths\)"
    ):
        tfr.load_manifest("hdfs://namenode/out")


@pytest.mark.parametrize(
    "data_dir",
    ["/data/out", "relative/out", "gs://bucket/out", "file:///data/out", "ram://x", "s3://b/out", "S3A://b/o"],
)
def test_readable_locations_pass(data_dir):
    check_readable_location(data_dir)

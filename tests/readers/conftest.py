"""Shared fixtures for the reader's tests: small real-photo datasets in the FORMAT.md layout."""

from __future__ import annotations

import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
# The repo root (for tfdata_readers) and this folder (for reader_fixtures), however pytest is run.
for path in (_HERE.parents[1], _HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import reader_fixtures  # noqa: E402
import versioned_fixtures  # noqa: E402


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """{encoding: data_dir} with train (50 examples, 4 shards) and validation (13 examples, 1 shard)."""
    root = tmp_path_factory.mktemp("reader_datasets")
    return {
        encoding: reader_fixtures.write_dataset(
            root / encoding, splits={"train": (50, 4), "validation": (13, 1)}, encoding=encoding
        )
        for encoding in ("jpeg", "png", "raw")
    }


@pytest.fixture
def jpeg_dir(datasets: dict[str, pathlib.Path]) -> pathlib.Path:
    return datasets["jpeg"]


@pytest.fixture(scope="session")
def job_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """Flat outputs of the current conversion job, run once each on real photos (64x48 JPEGs, 9 classes):
    "base": 45 photos, 4 shards a split (train 36: shards of 9); "addition": 12 other photos, 2
    shards a split (train ~10: smaller shards), to append to it."""
    from beam_jobs.sample_data import make_photo_tree

    root = tmp_path_factory.mktemp("job_outputs")
    outputs = {}
    for name, images, shards, seed in (("base", 45, 4, 1), ("addition", 12, 2, 2)):
        make_photo_tree(root / f"photos-{name}", num_images=images, size=(64, 48), seed=seed)
        outputs[name] = versioned_fixtures.run_conversion(root / f"photos-{name}", root / name, num_shards=shards)
    return outputs


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still run in CI)")

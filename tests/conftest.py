"""Shared fixtures: a tree of real photos with broken files, and a way to run the job's CLI."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from tests.photos import make_test_tree

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory):
    """(root, good paths, {broken path: reason}) of a tree with 36 real photos in 9 classes."""
    root = tmp_path_factory.mktemp("photos")
    good, broken = make_test_tree(root, num_images=36)
    return root, good, broken


def run_cli(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``python -m beam_jobs`` as a user would, in a fresh process."""
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"job failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-5000:]}")
    return result


def pytest_collection_modifyitems(session, config, items):
    """Runs the object-store tests last, in their usual order among themselves.

    On a fresh machine .ci/run builds MinIO and fake-gcs-server (minutes of CPU) in the background
    while the tests run; their fixtures wait for that build. Last, they find it done instead of
    idling on it. Nothing is left out: the order changes, not the set.
    """
    stores = REPO / "tests" / "objectstores"
    items.sort(key=lambda item: pathlib.Path(str(item.path)).is_relative_to(stores))  # sort() is stable

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

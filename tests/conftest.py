"""Shared fixtures: a tree of real photos with broken files, and a way to run the job's CLI."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.cluster.conftest import FLINK_VERSION, LAUNCH, SPARK_VERSION, FlinkCluster, SparkCluster, run_script
from tests.photos import make_test_tree

REPO = pathlib.Path(__file__).resolve().parents[1]


def prerequisite_missing(name: str) -> str | None:
    """The line with which ./run_tests.sh's set-up (.ci/install_test_prerequisites.sh) said that it
    could not install or build ``name`` (chromium, object-stores, flink), or None: it has it, or the
    set-up did not run in this session (a bare pytest, whose fixtures then try themselves)."""
    folder = os.environ.get("IMAGES_TO_TFRECORDS_PREREQUISITES")
    marker = pathlib.Path(folder, f"{name}.missing") if folder else None
    return marker.read_text(encoding="utf-8").strip() if marker is not None and marker.is_file() else None


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory):
    """(root, good paths, {broken path: reason}) of a tree with 36 real photos in 9 classes."""
    root = tmp_path_factory.mktemp("photos")
    good, broken = make_test_tree(root, num_images=36)
    return root, good, broken


# The Flink fixtures live here, not in tests/cluster/, so that the cluster's tests and the
# object-store test that runs Flink on MinIO share one cluster and one job server build.
@pytest.fixture(scope="session")
def flink_cluster(tmp_path_factory):
    """2 TaskManagers x 2 slots with a restart strategy, shared by every test that kills nothing in
    it (a cluster's start costs about 25 s): a job of parallelism 4 uses both TaskManagers."""
    cluster = FlinkCluster(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def flink_job_server_jar() -> str:
    """Beam's Flink job server jar, built once into the cache by the launch scripts. A machine
    without Java or Maven fails the Flink tests with that reason: they are never skipped."""
    missing = prerequisite_missing("flink")
    if missing:
        pytest.fail(missing)
    if not shutil.which("java"):
        pytest.fail("Java is missing: the Flink tests need a JDK 11 or 17 on PATH")
    if not os.environ.get("FLINK_JOB_SERVER_JAR") and not shutil.which("mvn"):
        pytest.fail(
            "Maven (mvn) is missing: the Flink tests build Beam's Flink job server with it "
            "(or set FLINK_JOB_SERVER_JAR to a jar built elsewhere)"
        )
    proc = run_script(
        [str(LAUNCH / "flink_cluster.sh"), "fetch", "--flink_version", FLINK_VERSION], timeout=900, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            "Beam's Flink job server could not be built, so FlinkRunner cannot run here: " + proc.stderr.strip()[-1500:]
        )
    for line in proc.stderr.splitlines():
        if "job server jar: " in line:
            return line.split("job server jar: ", 1)[1].strip()
    raise AssertionError(f"flink_cluster.sh fetch did not name the jar:\n{proc.stderr}")


@pytest.fixture(scope="session")
def spark_job_server_jar() -> str:
    """Spark (from PyPI's pyspark) and Beam's Spark job server jar, fetched and built once into the
    cache by the launch scripts; without Java or Maven the Spark tests fail naming it."""
    missing = prerequisite_missing("spark")
    if missing:
        pytest.fail(missing)
    if not shutil.which("java"):
        pytest.fail("Java is missing: the Spark tests need a JDK 11 or 17 on PATH")
    proc = run_script(
        [str(LAUNCH / "spark_cluster.sh"), "fetch", "--spark_version", SPARK_VERSION], timeout=900, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"Spark or Beam's Spark job server could not be had: {proc.stderr[-1500:]}")
    for line in proc.stderr.splitlines():
        if "job server jar: " in line:
            return line.split("job server jar: ", 1)[1].strip()
    raise AssertionError(f"spark_cluster.sh fetch did not name the jar:\n{proc.stderr}")


@pytest.fixture(scope="session")
def spark_cluster(spark_job_server_jar, tmp_path_factory):  # pylint: disable=unused-argument,redefined-outer-name
    """1 Worker x 2 cores, shared by the Spark tests that kill nothing in it."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# Beam's local runner starts a worker process per core for every run, and each imports Beam: about
# 13 s of CPU on a 2-core machine for a job of a few photos, three times the job's own work.
# Tests whose subject is not those processes run the same FnApiRunner in its in-process mode
# (--direct_running_mode in_memory, which users may choose too). Worker processes, the default,
# stay covered where they matter (``processes``): kills and interrupts, progress relayed from
# workers, the end-to-end tests, byte identity across the two modes, and every command of the
# docs (as a reader runs them).
IN_PROCESS = ("--direct_running_mode", "in_memory")
WORKER_PROCESSES = ("--direct_running_mode", "multi_processing")


def _names_a_runner(argv: list[str]) -> bool:
    return any(a.startswith(("--runner", "--direct_running_mode", "--flink")) for a in argv)


def in_process(argv: list[str]) -> list[str]:
    """``argv`` with the local runner kept in this process, unless it names a runner or a mode."""
    return argv if _names_a_runner(argv) else [*argv, *IN_PROCESS]


def run_cli(
    *args: str, check: bool = True, timeout: float = 300, processes: bool = False
) -> subprocess.CompletedProcess:
    """Runs ``python -m beam_jobs`` as a user would, in a fresh process; the local runner in that
    process, or with ``processes`` in Beam's worker processes (the default a user gets)."""
    argv = [str(a) for a in args]
    if not _names_a_runner(argv):
        argv = [*argv, *(WORKER_PROCESSES if processes else IN_PROCESS)]
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"job failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-5000:]}")
    return result


# Test modules that share a Flink cluster (the session's flink_cluster fixture) run in one
# worker process, so that the cluster starts once.
_FLINK_GROUP = (
    "tests/cluster/test_flink.py",
    "tests/cluster/test_runners.py",
    "tests/cluster/test_launch_scripts.py",
    "tests/objectstores/test_flink_s3.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(session, config, items):
    """Orders the suite and groups it for the parallel workers (pytest-xdist, --dist loadgroup).

    Each test module is one group, run whole by one worker, so that its module and session
    fixtures (a converted dataset, a TensorFlow subprocess's results) are built once; the
    modules that share a Flink cluster are one group. The object-store tests run last, in their
    usual order among themselves: where the suite runs without ./run_tests.sh's set-up, their
    fixtures build MinIO and fake-gcs-server (minutes of CPU), and a build begun elsewhere
    meanwhile is further along by then. Nothing is left out: the order and the grouping change,
    not the set.
    """
    stores = REPO / "tests" / "objectstores"
    items.sort(key=lambda item: pathlib.Path(str(item.path)).is_relative_to(stores))  # sort() is stable
    for item in items:
        module = pathlib.Path(str(item.path)).relative_to(REPO).as_posix()
        item.add_marker(pytest.mark.xdist_group("flink" if module in _FLINK_GROUP else module))

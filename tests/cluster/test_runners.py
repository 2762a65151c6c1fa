"""The same conversion on the local runner, a portable job service, and a real Flink cluster's
worker pool must give byte-identical shards, an identical dataset_info.json and the same dead
letters. FlinkRunner itself is tested in test_flink.py."""

from __future__ import annotations

import json
import sys

import pytest

from tests.cluster.conftest import JOB_FLAGS, LAUNCH, assert_same_output, output_files, run_script

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_local_output_is_complete(local_output, photo_tree):
    files = output_files(local_output)
    assert sorted(files) == ["dataset_info.json", "dead_letters.jsonl"] + [
        f"train-0000{i}-of-00004.tfrecord" for i in range(4)
    ]
    assert len(files["dead_letters.jsonl"].splitlines()) == 7


@pytest.mark.timeout(900)
def test_portable_job_service_matches_local(local_output, photo_tree, tmp_path):
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    proc = run_script(
        [
            str(LAUNCH / "run_portable.sh"),
            "--log_dir",
            str(logs),
            "--input",
            str(photo_tree),
            "--output_dir",
            str(out),
            *JOB_FLAGS,
        ],
        timeout=600,
    )
    assert "--runner=PortableRunner" in proc.stderr
    assert_same_output(out, local_output)
    # run_portable.sh stops the job service and worker pool it started.
    assert not (logs / "job-service.pid").exists() and not (logs / "worker-pool.pid").exists()


@pytest.mark.timeout(900)
def test_portable_job_service_with_the_clusters_worker_pool(flink_cluster, local_output, photo_tree, tmp_path):
    # The worker pool that flink_cluster.sh starts serves any portable runner.
    out = tmp_path / "out"
    run_script(
        [
            str(LAUNCH / "run_portable.sh"),
            "--worker_pool",
            flink_cluster.worker_pool,
            "--input",
            str(photo_tree),
            "--output_dir",
            str(out),
            *JOB_FLAGS,
        ],
        timeout=600,
    )
    assert_same_output(out, local_output)


@pytest.mark.timeout(900)
def test_split_groups_on_a_portable_job_service_match_local(photo_tree, tmp_path):
    """Near-copy groups are planned by shuffles and one combined element: the same groups, splits
    and bytes on another runner (the sample photos are crops of nine photographs: many groups)."""
    flags = [*JOB_FLAGS, "--splits", "train=0.5,validation=0.5", "--split_groups", "near_copies"]
    local, portable = tmp_path / "local", tmp_path / "portable"
    run_script(
        [sys.executable, "-m", "beam_jobs", "--input", str(photo_tree), "--output_dir", str(local), *flags], timeout=300
    )
    run_script(
        [str(LAUNCH / "run_portable.sh"), "--input", str(photo_tree), "--output_dir", str(portable), *flags],
        timeout=600,
    )
    info = json.loads((local / "dataset_info.json").read_text(encoding="utf-8"))
    assert info["split_groups"]["groups"] > 0 and info["split_groups"]["pairs_across_splits"] == 0
    assert_same_output(portable, local)

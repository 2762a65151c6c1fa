"""FlinkRunner on a real Flink cluster with 2 TaskManagers, input and output on MinIO: how a Flink
cluster without a shared disk runs the job (the session's cluster, tests/cluster/conftest.py, at
parallelism 4 so that both TaskManagers convert). Same bytes as the local-disk run, nothing left in the
bucket, and the keys in no log (the submit script's, the job's, Flink's own)."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.cluster.conftest import LAUNCH, rest_get, run_script
from tests.objectstores.conftest import JOB_FLAGS, local_files
from tests.objectstores.stores import assert_matches_local, assert_no_secret, dataset_names, normalise_names

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.mark.timeout(900)
def test_flink_two_taskmanagers_store_to_store(minio, messy_tree, local_reference, flink_cluster, flink_job_server_jar):
    bucket = f"flink-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for path in local_files(messy_tree):
        client.upload_file(str(path), bucket, f"tree/{path.relative_to(messy_tree).as_posix()}")
    tree = minio.keys(bucket, "tree/")
    before = flink_cluster.job_ids()
    proc = run_script(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--flink_master",
            flink_cluster.flink_master,
            "--environment_config",
            flink_cluster.worker_pool,
            "--parallelism",
            "4",
            "--flink_job_server_jar",
            flink_job_server_jar,
            "--input",
            f"s3://{bucket}/tree",
            "--output_dir",
            f"s3://{bucket}/out",
            *JOB_FLAGS,
            *minio.job_flags(),
        ],
        timeout=600,
    )
    job = flink_cluster.new_job(before)
    assert job["state"] == "FINISHED", job
    assert flink_cluster.taskmanagers_used(job["jid"]) == {"tm-0", "tm-1"}

    got = {
        key[len("out/") :]: client.get_object(Bucket=bucket, Key=key)["Body"].read()
        for key in minio.keys(bucket, "out/")
    }
    assert_matches_local(
        got,
        local_reference,
        input_root=f"s3://{bucket}/tree",
        output_root=f"s3://{bucket}/out",
        reference_input=str(messy_tree),
    )
    assert sorted(map(normalise_names, minio.keys(bucket))) == sorted(
        tree + [f"out/{name}" for name in dataset_names(local_reference)]
    )
    assert minio.unfinished_uploads(bucket) == []
    # Every log of the cluster: JobManager, TaskManagers (where the SDK workers log), worker pool.
    # Not Flink's own job state (its archived execution graph under tmp/): the options travel to
    # the cluster inside the job, keys included, as every Beam runner needs them to.
    logs = {str(p): p.read_bytes() for p in local_files(flink_cluster.state_dir / "log")}
    assert any("taskexecutor-1" in name for name in logs), sorted(logs)
    assert "--s3_secret_access_key \\<redacted\\>" in proc.stderr  # its command line, logged without the keys
    assert_no_secret(
        [minio.secret_key, minio.access_key],
        stdout=proc.stdout,
        stderr=proc.stderr,
        **logs,
        **{f"s3://{bucket}/out/{name}": data for name, data in got.items()},
    )
    # Not a log, but worth knowing: FlinkRunner stores the pipeline options in the job's
    # configuration, which Flink's web UI and REST API show, so keys passed as options are visible
    # there (measured here). On a shared cluster give the workers their keys through the AWS default
    # credential chain (environment, instance profile) instead of --s3_* options.
    config = json.dumps(rest_get(flink_cluster.rest_port, f"/jobs/{job['jid']}/config"))
    assert minio.access_key in config

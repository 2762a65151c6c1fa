"""SparkRunner on a real Spark standalone cluster, input and output on MinIO: how a Spark cluster
without a shared disk runs the job. Same bytes as the local-disk run, nothing left in the bucket,
and the keys in no log (the submit script's, the job's, Spark's Master, Worker, executor and job
server logs, the worker pool's)."""

from __future__ import annotations

import uuid

import pytest

from tests.cluster.conftest import run_script
from tests.objectstores.conftest import JOB_FLAGS, local_files
from tests.objectstores.stores import assert_matches_local, assert_no_secret, dataset_names, normalise_names

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.mark.timeout(900)
def test_spark_store_to_store(minio, messy_tree, local_reference, spark_cluster):
    bucket = f"spark-{uuid.uuid4().hex[:8]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    for path in local_files(messy_tree):
        client.upload_file(str(path), bucket, f"tree/{path.relative_to(messy_tree).as_posix()}")
    tree = minio.keys(bucket, "tree/")
    proc = run_script(
        spark_cluster.submit_args(
            ["--input", f"s3://{bucket}/tree", "--output_dir", f"s3://{bucket}/out", *JOB_FLAGS, *minio.job_flags()]
        ),
        timeout=600,
    )
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
    # Every log of the cluster: the Master's, the Worker's, the job server's (the job's Spark
    # driver), the worker pool's, and each executor's (under work/, where the SDK workers' log
    # lines arrive).
    logs = {str(p): p.read_bytes() for p in local_files(spark_cluster.state_dir / "log")}
    logs |= {str(p): p.read_bytes() for p in local_files(spark_cluster.state_dir / "work") if p.name == "stderr"}
    assert any("/work/" in name for name in logs), sorted(logs)
    assert "--s3_secret_access_key \\<redacted\\>" in proc.stderr  # its command line, logged without the keys
    assert_no_secret(
        [minio.secret_key, minio.access_key],
        stdout=proc.stdout,
        stderr=proc.stderr,
        **logs,
        **{f"s3://{bucket}/out/{name}": data for name, data in got.items()},
    )

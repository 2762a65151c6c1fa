"""gs:// end to end on fake-gcs-server through Beam's GCS filesystem (batch rename and delete
included): store to store on the local runner, byte-identical to the local-disk run, and nothing
left in the bucket beyond the dataset. The job connects to the
emulator anonymously at once (beam_jobs/storage.py), as google-cloud-storage does.
"""

from __future__ import annotations

import uuid

import pytest

from tests.objectstores.conftest import JOB_FLAGS, local_files, run_job
from tests.objectstores.stores import assert_matches_local, dataset_names, normalise_names

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def gcs_bucket(fake_gcs, messy_tree) -> str:
    """A fresh bucket holding the messy tree under tree/."""
    client = fake_gcs.client()
    bucket = client.create_bucket(f"imgs-{uuid.uuid4().hex[:8]}")
    for path in local_files(messy_tree):
        bucket.blob(f"tree/{path.relative_to(messy_tree).as_posix()}").upload_from_filename(str(path))
    return bucket.name


def test_store_to_store_matches_local_disk_and_leaves_nothing_else(fake_gcs, gcs_bucket, messy_tree, local_reference):
    tree = fake_gcs.names(gcs_bucket, "tree/")
    result = run_job(
        "--input",
        f"gs://{gcs_bucket}/tree",
        "--output_dir",
        f"gs://{gcs_bucket}/out",
        *JOB_FLAGS,
        "--project",
        "test",
        env=fake_gcs.env,
    )
    assert "wrote train: 36 examples in 3 shards" in result.stdout
    bucket = fake_gcs.client().bucket(gcs_bucket)
    got = {name[len("out/") :]: bucket.blob(name).download_as_bytes() for name in fake_gcs.names(gcs_bucket, "out/")}
    assert_matches_local(
        got,
        local_reference,
        input_root=f"gs://{gcs_bucket}/tree",
        output_root=f"gs://{gcs_bucket}/out",
        reference_input=str(messy_tree),
    )
    # No temp, staged, probe or lock object anywhere, and the input untouched.
    assert sorted(map(normalise_names, fake_gcs.names(gcs_bucket))) == sorted(
        tree + [f"out/{name}" for name in dataset_names(local_reference)]
    )

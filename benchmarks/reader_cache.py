"""Benchmark: the reader on s3:// through its shard cache, against reading the same shards from local disk.

The dataset: N real photos (500x375, the sample tree's) converted to 224x224 JPEG shards; a copy
is uploaded to a MinIO server on loopback (built by .ci/install_object_stores.sh). Every figure is
one whole evaluation epoch (batches of 32, uint8, decoded) in a fresh process, timed from the
first `make_dataset` call, with the conditions interleaved over the repeats:

- local: the shards read where the job wrote them;
- warm cache: s3:// through a cache folder that already holds every shard;
- cold cache: s3:// through an empty cache folder (each shard downloaded, hashed, published);
- download only: boto3 downloading every shard to a folder (the bandwidth the cold epoch is bound by).

    python benchmarks/reader_cache.py                    # 2000 images, 16 shards, 3 repeats
    python benchmarks/reader_cache.py --num_images 400 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import pathlib
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from _photo_shards import photo_shards

REPO = pathlib.Path(__file__).resolve().parents[1]

_EPOCH = """
import sys, time
start = time.perf_counter()
import tfdata_readers as tfr
config = tfr.ReadConfig(cache_dir=sys.argv[2]) if sys.argv[2] != "-" else tfr.ReadConfig()
images = sum(int(b[0].shape[0]) for b in tfr.make_dataset(sys.argv[1], "train", 32, config=config, dtype="uint8"))
print("RESULT", images, time.perf_counter() - start)
"""

_DOWNLOAD = """
import json, os, sys, time
start = time.perf_counter()
import boto3
from boto3.s3.transfer import TransferConfig
client = boto3.client("s3")
bucket, prefix, target = sys.argv[1], sys.argv[2], sys.argv[3]
listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
keys = [o["Key"] for o in listed if o["Key"].endswith(".tfrecord")]
config = TransferConfig(multipart_threshold=8 * 2**20, multipart_chunksize=8 * 2**20, max_concurrency=8)
for key in keys:
    client.download_file(bucket, key, os.path.join(target, os.path.basename(key)), Config=config)
print("RESULT", len(keys), time.perf_counter() - start)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_minio(folder: pathlib.Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    built = subprocess.run(
        [str(REPO / ".ci" / "install_object_stores.sh"), "minio"], capture_output=True, text=True, check=True
    )
    binary = built.stdout.strip().splitlines()[-1]
    port = _free_port()
    server = subprocess.Popen(
        [binary, "server", "--quiet", "--address", f"127.0.0.1:{port}", str(folder)],
        env={**os.environ, **env, "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2):
                return server, endpoint
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("MinIO did not start")


def _run(script: str, *args: str, env: dict[str, str]) -> tuple[int, float]:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"a measurement failed:\n{proc.stderr[-3000:]}")
    _, count, seconds = lines[-1].split()
    return int(count), float(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work_dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "reader_cache_bench"
    )
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--num_shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = args.work_dir
    data = photo_shards(work, args.num_images, args.num_shards)
    keys = {"MINIO_ROOT_USER": "bench" + secrets.token_hex(4), "MINIO_ROOT_PASSWORD": "s" + secrets.token_hex(12)}
    shutil.rmtree(work / "minio", ignore_errors=True)
    server, endpoint = _start_minio(work / "minio", keys)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": keys["MINIO_ROOT_USER"],
        "AWS_SECRET_ACCESS_KEY": keys["MINIO_ROOT_PASSWORD"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        import boto3  # pylint: disable=import-outside-toplevel

        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="bench")
        for path in sorted(p for p in data.rglob("*") if p.is_file()):
            client.upload_file(str(path), "bench", f"data/{path.relative_to(data).as_posix()}")
        uri = "s3://bench/data"
        warm = work / "warm_cache"
        shutil.rmtree(warm, ignore_errors=True)
        _run(_EPOCH, uri, str(warm), env=env)  # fills the warm cache
        times: dict[str, list[float]] = {"local": [], "warm cache": [], "cold cache": [], "download only": []}
        images = 0
        for _ in range(args.repeats):
            images, seconds = _run(_EPOCH, str(data), "-", env=env)
            times["local"].append(seconds)
            times["warm cache"].append(_run(_EPOCH, uri, str(warm), env=env)[1])
            cold = work / "cold_cache"
            shutil.rmtree(cold, ignore_errors=True)
            times["cold cache"].append(_run(_EPOCH, uri, str(cold), env=env)[1])
            target = work / "download"
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            times["download only"].append(_run(_DOWNLOAD, "bench", "data/", str(target), env=env)[1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    shard_bytes = sum(p.stat().st_size for p in data.rglob("*.tfrecord"))
    print(f"\n{images} images, {shard_bytes / 2**20:.1f} MiB of shards, {args.repeats} repeats (medians)\n")
    local = statistics.median(times["local"])
    print("| condition | seconds per epoch | images/s | vs local | per repeat |\n|---|---:|---:|---:|---|")
    for name, values in times.items():
        median = statistics.median(values)
        rate = f"{images / median:.0f}" if name != "download only" else f"{shard_bytes / 2**20 / median:.0f} MiB/s"
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {median:.2f} | {rate} | {local / median:.2f}x | {shown} |")


if __name__ == "__main__":
    main()

"""Reading through the shard cache: the same examples in the same order as reading the shards
where they are, a cache that stays under its limit, a damaged shard named and never read, a
killed download cleaned up, and readers in two processes sharing one cache folder."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfdata_readers as tfr
from tfdata_readers.sources.shard_cache import CacheFullError, ShardCache, ShardCacheError, ShardDigestError


def _keys(data_dir, config: tfr.ReadConfig, **options) -> list[bytes]:
    dataset = tfr.make_dataset(data_dir, "train", 5, config=config, with_metadata=True, **options)
    return [key for _, _, meta in dataset for key in meta["key"].numpy()]


def _shards(data_dir: pathlib.Path) -> list[dict]:
    return json.loads((data_dir / "dataset_info.json").read_text())["splits"]["train"]["shards"]


def test_reading_through_the_cache_yields_what_reading_in_place_yields(jpeg_dir, tmp_path):
    for options in ({}, {"training": True, "seed": 7}):
        direct = _keys(jpeg_dir, tfr.ReadConfig(), **options)
        cached = _keys(jpeg_dir, tfr.ReadConfig(cache_dir=str(tmp_path / "cache")), **options)
        assert cached == direct and len(direct) == 50
    names = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix == ".tfrecord")
    assert names == sorted(s["sha256"] + ".tfrecord" for s in _shards(jpeg_dir))


def _python_calls(dataset) -> int:
    """How many Python calls (py_function, numpy_function) the dataset's graph holds."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    return sum(node.op in ("EagerPyFunc", "PyFunc", "PyFuncStateless") for node in nodes)


def test_reading_through_the_cache_runs_no_python_inside_tf_data(jpeg_dir, tmp_path):
    """After the download, the pipeline reads the verified copy with TensorFlow's ops alone: a Python
    call per piece would make TensorFlow's iterator destructor wait for the GIL its caller holds."""
    for options in ({}, {"training": True, "seed": 3}):
        local = tfr.make_dataset(jpeg_dir, "train", 5, **options)
        cached = tfr.make_dataset(jpeg_dir, "train", 5, cache_dir=str(tmp_path / "c"), **options)
        assert _python_calls(cached) == _python_calls(local)


def test_a_cache_smaller_than_the_dataset_stays_under_its_limit(jpeg_dir, tmp_path):
    sizes = [s["bytes"] for s in _shards(jpeg_dir)]
    limit = sum(sorted(sizes)[-2:]) + 1  # two shards at most: the dataset has four
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit, cycle_length=1, cache_lookahead=1)
    for epoch_seed in (1, 2):
        keys = _keys(jpeg_dir, config, training=True, seed=epoch_seed)
        assert len(keys) == 50 and len(set(keys)) == 50
        held = sum(p.stat().st_size for p in (tmp_path / "c").iterdir() if p.suffix == ".tfrecord")
        assert held <= limit


def test_a_shard_whose_bytes_differ_from_the_manifest_is_named_and_never_read(jpeg_dir, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(jpeg_dir, damaged)
    shard = damaged / _shards(damaged)[1]["file"]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF  # a flipped bit in the last record's payload: same size, other bytes
    shard.write_bytes(bytes(data))
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "cache"))
    with pytest.raises(Exception, match=rf"shard {shard}: its bytes have sha256 .* but the manifest says"):
        _keys(damaged, config)
    held = {p.name for p in (tmp_path / "cache").iterdir() if p.suffix in (".tfrecord", ".part")}
    assert _shards(damaged)[1]["sha256"] + ".tfrecord" not in held and not [n for n in held if n.endswith(".part")]


def test_a_killed_downloads_part_file_is_removed_and_a_shard_too_big_is_refused(jpeg_dir, tmp_path):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    part = tmp_path / "c" / f".{'a' * 64}.123.{int(dead.stdout)}.ff.part"
    part.write_bytes(b"x" * 123)
    shard = _shards(jpeg_dir)[0]
    path = cache.acquire(str(jpeg_dir / shard["file"]), shard["sha256"], shard["bytes"])
    assert not part.exists() and pathlib.Path(path).read_bytes() == (jpeg_dir / shard["file"]).read_bytes()
    cache.release(shard["sha256"])
    with pytest.raises(CacheFullError, match="larger than the cache's limit"):
        ShardCache(str(tmp_path / "small"), 10).acquire(str(jpeg_dir / shard["file"]), shard["sha256"], shard["bytes"])
    with pytest.raises(ShardDigestError):
        cache.acquire(str(jpeg_dir / shard["file"]), "0" * 64, shard["bytes"])
    cache.close()


def test_a_leased_shard_is_never_evicted_and_a_full_cache_goes_over_its_limit_rather_than_wait(jpeg_dir, tmp_path):
    """Admission never waits on another process's progress: with the folder full of shards that two
    caches (as two processes) lease, a third shard goes over the limit; once the leases end, the
    next download evicts down to the limit again."""
    shards = _shards(jpeg_dir)
    limit = max(s["bytes"] for s in shards) * 2 + 1
    first = ShardCache(str(tmp_path / "c"), limit)
    second = ShardCache(str(tmp_path / "c"), limit)  # as another process sees the folder
    a, b, c, d = shards[:4]
    held = first.acquire(str(jpeg_dir / a["file"]), a["sha256"], a["bytes"])
    second.acquire(str(jpeg_dir / b["file"]), b["sha256"], b["bytes"])
    over = second.acquire(str(jpeg_dir / c["file"]), c["sha256"], c["bytes"])
    assert pathlib.Path(held).exists() and pathlib.Path(over).exists()
    assert _held(tmp_path / "c") == a["bytes"] + b["bytes"] + c["bytes"] > limit  # over by what is leased
    for cache, shard in ((first, a), (second, b), (second, c)):
        cache.release(shard["sha256"])
    second.acquire(str(jpeg_dir / d["file"]), d["sha256"], d["bytes"])  # the unleased ones make room
    assert not pathlib.Path(held).exists() and _held(tmp_path / "c") <= limit
    first.close()
    second.close()


def _held(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".tfrecord")


_READER = """
import sys, tfdata_readers as tfr
config = tfr.ReadConfig(cache_dir=sys.argv[2], cache_limit_bytes=int(sys.argv[3]), cycle_length=2)
ds = tfr.make_dataset(sys.argv[1], "train", 5, config=config, training=True, seed=int(sys.argv[4]), with_metadata=True)
for epoch in range(2):
    print(",".join(sorted(k.decode() for _, _, m in ds for k in m["key"].numpy())))
"""


def test_two_processes_share_one_cache_and_each_reads_every_example(jpeg_dir, tmp_path):
    sizes = [s["bytes"] for s in _shards(jpeg_dir)]
    limit = sum(sizes) - min(sizes) + 1  # not the whole dataset: the two readers evict under each other
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    readers = [
        subprocess.Popen(
            [sys.executable, str(script), str(jpeg_dir), str(tmp_path / "cache"), str(limit), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in (1, 2)
    ]
    want = ",".join(sorted(k.decode() for k in _keys(jpeg_dir, tfr.ReadConfig())))
    for reader in readers:
        out, err = reader.communicate(timeout=600)
        assert reader.returncode == 0, err[-3000:]
        assert out.split() == [want, want]
    held = sum(p.stat().st_size for p in (tmp_path / "cache").iterdir() if p.suffix == ".tfrecord")
    assert held <= limit and np.isfinite(held)


_TRAINER = """
import sys, tfdata_readers as tfr
data_dir, cache, limit, seed, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
config = tfr.ReadConfig(cache_dir=cache, cache_limit_bytes=limit, cycle_length=2, num_epochs=None)
ds = tfr.make_dataset(data_dir, "train", 5, config=config, training=True, seed=seed, with_metadata=True)
keys = [k.decode() for _, _, m in ds.take(epochs * 10) for k in m["key"].numpy()]
for epoch in range(epochs):
    print(",".join(sorted(keys[epoch * 50 : (epoch + 1) * 50])))
"""


@pytest.mark.slow
@pytest.mark.parametrize("trainers", [2, 3])
def test_trainers_sharing_a_cache_smaller_than_their_cycles_never_stall(jpeg_dir, tmp_path, trainers):
    """Each trainer passes the start-up check (the limit holds its own cycle_length of shards), but
    together they lease more than the limit holds: each reads several epochs to the end, every
    example once an epoch, none waiting for room only another could free. A stall is a failure
    (the timeout), not a wait; the cache goes over its limit by at most what the trainers lease."""
    sizes = [s["bytes"] for s in _shards(jpeg_dir)]
    limit = 2 * max(sizes) + 1
    epochs = 4
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    readers = [
        subprocess.Popen(
            [sys.executable, str(script), str(jpeg_dir), str(tmp_path / "cache"), str(limit), str(seed), str(epochs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in range(1, trainers + 1)
    ]
    want = ",".join(sorted(k.decode() for k in _keys(jpeg_dir, tfr.ReadConfig())))
    try:
        for reader in readers:
            out, err = reader.communicate(timeout=480)
            assert reader.returncode == 0, err[-3000:]
            assert out.split() == [want] * epochs
    finally:
        for reader in readers:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
    assert _held(tmp_path / "cache") <= sum(sorted(sizes)[-2:]) * trainers


def test_a_cache_too_small_for_the_shards_read_at_once_is_refused_at_start_up(jpeg_dir, tmp_path):
    largest = max(s["bytes"] for s in _shards(jpeg_dir))
    config = tfr.ReadConfig(cache_dir=str(tmp_path / "c"), cache_limit_bytes=2 * largest - 1, cycle_length=2)
    with pytest.raises(ValueError, match=rf"cannot hold the 2 shards .* at least {2 * largest}, or lower cycle_length"):
        tfr.make_dataset(jpeg_dir, "train", 5, config=config)


def test_the_cache_touches_only_what_it_put_in_its_folder(jpeg_dir, tmp_path):
    """A user's own .tfrecord files and a folder named like a shard are left alone; the temporary file
    a killed download's SDK left beside its part file, and a part file whose pid now names another
    process (no download holds its shard's lock), are the cache's to remove."""
    folder = tmp_path / "c"
    folder.mkdir()
    mine = folder / "my-own.tfrecord"
    mine.write_bytes(b"x" * 20000)
    (folder / ("f" * 64 + ".tfrecord")).mkdir()
    os.utime(mine, (0, 0))  # the oldest file in the folder: the first an LRU would take
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    sdk_temp = folder / f".{'a' * 64}.123.{int(dead.stdout)}.ff.part.e5de9883"
    sdk_temp.write_bytes(b"x" * 123)
    reused_pid = folder / f".{'b' * 64}.30000.1.deadbeef.part"  # pid 1 is alive: a restarted container's
    reused_pid.write_bytes(b"")
    sizes = [s["bytes"] for s in _shards(jpeg_dir)]
    config = tfr.ReadConfig(cache_dir=str(folder), cache_limit_bytes=max(sizes) + 1, cycle_length=1, cache_lookahead=0)
    assert len(_keys(jpeg_dir, config)) == 50
    assert mine.read_bytes() == b"x" * 20000 and (folder / ("f" * 64 + ".tfrecord")).is_dir()
    assert not sdk_temp.exists() and not reused_pid.exists()
    cache = ShardCache(str(folder), 10**9)
    (folder / (_shards(jpeg_dir)[0]["sha256"] + ".tfrecord")).mkdir()
    shard = _shards(jpeg_dir)[0]
    with pytest.raises(ShardCacheError, match=r"in the shard cache is not a file: .*a folder of its own"):
        cache.acquire(str(jpeg_dir / shard["file"]), shard["sha256"], shard["bytes"])
    cache.close()


def test_a_cache_that_went_over_its_limit_for_a_reader_trims_back_once_its_shards_are_released(tmp_path):
    """A download may go over the limit while other readers lease the rest (it never waits); once
    the leases end, the cache holds its limit again, least recently used shards evicted first."""
    from tfdata_readers.sources.shard_cache import ShardCache  # pylint: disable=import-outside-toplevel

    cache = ShardCache(str(tmp_path), limit_bytes=100)
    leased, downloaded = "a" * 64, "b" * 64
    (tmp_path / f"{leased}.tfrecord").write_bytes(b"x" * 60)
    assert cache._lease(leased)  # pylint: disable=protected-access
    (tmp_path / f"{downloaded}.tfrecord").write_bytes(b"y" * 60)  # published over the limit
    os.utime(tmp_path / f"{leased}.tfrecord", (1, 1))  # the least recently used
    cache.release(leased)
    held = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tfrecord")
    assert held == [f"{downloaded}.tfrecord"]

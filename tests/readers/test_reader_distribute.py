"""Exactly-once under tf.distribute: MirroredStrategy on 1, 2, 3 and 8 logical CPUs, and 2 workers."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import reader_fixtures

_HERE = pathlib.Path(__file__).resolve().parent
_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "CUDA_VISIBLE_DEVICES": ""}
_AUTO_SHARD_WARNINGS = ("AutoShardPolicy", "auto_shard_policy", "auto-shard", "autoshard")


@pytest.fixture(scope="module")
def mirrored_results(tmp_path_factory) -> tuple[dict[str, str], str]:
    root = tmp_path_factory.mktemp("mirrored")
    # 23 examples: not a multiple of any global batch (2, 4, 6, 16); 1, 3 and 11 shard files.
    dirs = [
        reader_fixtures.write_dataset(root / f"s{n}", splits={"train": (23, n)}, image_size=(16, 16), seed=n)
        for n in (1, 3, 11)
    ]
    out = root / "results.json"
    proc = subprocess.run(
        [sys.executable, str(_HERE / "distribute_check.py"), str(out), *map(str, dirs)],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
@pytest.mark.parametrize("shards", [1, 3, 11])
@pytest.mark.parametrize("check", ["eval", "train epoch 1", "train epoch 2", "train repeat"])
def test_mirrored_exactly_once(mirrored_results, replicas: int, shards: int, check: str) -> None:
    results, _ = mirrored_results
    name = f"replicas={replicas} shards={shards} examples=23 {check}"
    assert name in results, sorted(results)
    assert results[name] == "", f"{name}: {results[name]}"


@pytest.mark.slow
def test_mirrored_prints_no_auto_shard_warning(mirrored_results) -> None:
    _, stderr = mirrored_results
    for text in _AUTO_SHARD_WARNINGS:
        assert text not in stderr


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
@pytest.mark.parametrize("shards", [4, 1, 3])
def test_multi_worker_exactly_once(tmp_path: pathlib.Path, shards: int) -> None:
    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (23, shards)}, image_size=(16, 16))
    expected = sorted(reader_fixtures.expected_keys(data_dir, "train"))
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(_HERE / "multiworker_worker.py"), str(tmp_path / f"w{index}.json"), str(data_dir)],
                env={**_ENV, "TF_CONFIG": json.dumps(tf_config)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=300))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-4000:]
    seen = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(2)]
    assert seen[0]["num_replicas_in_sync"] == 2
    for run in ("eval", "train1", "train2"):
        assert sorted(seen[0][run] + seen[1][run]) == expected, run
        assert not set(seen[0][run]) & set(seen[1][run])
        assert seen[0][run] and seen[1][run]  # both workers did work
    assert seen[0]["train1"] != seen[0]["train2"]
    stderr = "".join(err for _, err in outputs)
    # Equal shares (23 examples: 12 and 11) whether the 2 workers' files divide evenly or not.
    assert sorted(len(seen[i]["eval"]) for i in range(2)) == [11, 12]
    # Training drops the remainder: 23 // 8 = 2 full global steps, 4 examples a step from each worker.
    assert [len(seen[i]["train_drop"]) for i in range(2)] == [8, 8]
    assert not set(seen[0]["train_drop"]) & set(seen[1]["train_drop"])
    for text in _AUTO_SHARD_WARNINGS:
        assert text not in stderr


# Keras 3 fit under MirroredStrategy on 2 logical CPUs: step totals, no "ran out of data", class weights.


@pytest.fixture(scope="module")
def keras_results(datasets, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("keras_mirrored") / "results.json"
    proc = subprocess.run(
        [sys.executable, str(_HERE / "keras_mirrored_check.py"), str(out), str(datasets["jpeg"])],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


# The `datasets` fixture: train 50 examples, validation 13; global batch 8 over 2 replicas.
@pytest.mark.slow
@pytest.mark.parametrize(
    "name,steps",
    [
        ("train", 50 // 8),
        ("eval", 7),
        ("train 3 epochs", 3 * (50 // 8)),
        ("eval 2 epochs", 13),
        ("train endless", -1),
    ],
)
def test_distributed_cardinality_is_the_global_step_count(keras_results, name: str, steps: int) -> None:
    # eval: 13 per-replica batches of 4 (the last partial) make 7 global steps; two passes, 26 make 13.
    assert keras_results[f"{name} cardinality"] == steps
    assert keras_results[f"{name} steps"] == steps


@pytest.mark.slow
def test_keras_fit_on_a_distributed_dataset_shows_steps_and_never_runs_out(keras_results) -> None:
    output = keras_results["fit output"]
    assert not [w for w in keras_results["fit warnings"] if "ran out of data" in w]
    assert "Unknown" not in output
    assert "6/6" in output  # 50 // 8 training steps, shown from the first epoch on
    assert len(keras_results["fit val_losses"]) == 2 and keras_results["finite"]


@pytest.mark.slow
def test_class_weights_give_per_example_weights_under_mirrored(keras_results) -> None:
    expected = {0: 2.0, 3: 0.5, 6: 0.0}
    pairs = keras_results["weights"]
    assert len(pairs) == 8 * (50 // 8)
    assert all(weight == expected.get(label, 1.0) for label, weight in pairs), pairs
    assert {label for label, _ in pairs} >= {0, 3}


@pytest.mark.slow
def test_fit_class_weight_with_a_distributed_dataset_names_the_supported_way(keras_results) -> None:
    error = keras_results["class_weight error"]
    assert error.startswith("ValueError"), error
    assert "class_weights={label id: weight}" in error


@pytest.mark.slow
def test_distribute_initial_epoch_replays_the_uninterrupted_steps(keras_results) -> None:
    resumed, uninterrupted = keras_results["resumed"], keras_results["uninterrupted"]
    assert len(resumed) == len(uninterrupted) == 2 * (50 // 8)
    assert resumed == uninterrupted  # keys and pixel sums of every global step of epochs 2 and 3

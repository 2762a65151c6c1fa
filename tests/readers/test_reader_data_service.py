"""The reader through a real tf.data service (a dispatcher and worker processes on loopback, started
by launch/data_service.sh): exactly once by key, training with train_mirrored.py, a worker SIGKILLed."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import reader_fixtures
import tensorflow as tf

import tfdata_readers
from tests.conftest import IN_PROCESS

_REPO = pathlib.Path(__file__).resolve().parents[2]
_HERE = pathlib.Path(__file__).resolve().parent
_SCRIPT = _REPO / "launch" / "data_service.sh"
_ENV = {
    **os.environ,
    "PYTHON": sys.executable,
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONPATH": str(_REPO),
}


def _script(*args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(_SCRIPT), *args], capture_output=True, text=True, env=_ENV, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"data_service.sh {args[0]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
        )
    return proc


def _read_until(proc: subprocess.Popen, marker: str) -> None:
    """Reads `proc`'s stdout until a line holding `marker`; fails with its stderr if it ends first.
    No deadline of its own: the test's timeout guards a hang, and a busy machine is only slower."""
    for line in proc.stdout:
        if marker in line:
            return
    proc.wait()
    raise AssertionError(f"exited {proc.returncode} before printing {marker!r}:\n{proc.stderr.read()[-3000:]}")


def _pids(state_dir: pathlib.Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in sorted((state_dir / "pid").glob("*.pid"))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pathlib.Path(f"/proc/{pid}").exists() and "Z" not in pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2]


def _processes_of(state_dir: pathlib.Path) -> list[int]:
    """Every live process whose command line names this state dir or its ports (workers, loops, dispatcher)."""
    ports = (state_dir / "ports").read_text()
    marks = [str(state_dir).encode()] + [
        f"--port {p}".encode().replace(b" ", b"\0") for line in ports.split() for p in line.split("=")[1].split(",")
    ]
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"data_service" in cmdline and any(m in cmdline for m in marks) and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _service(state_dir: pathlib.Path, workers: int, *options: str) -> Iterator[str]:
    """A running service (its dispatcher's address); stopped afterwards, checking that nothing is left."""
    try:
        start = _script("start", "--state_dir", str(state_dir), "--workers", str(workers), *options)
        address = start.stdout.strip().splitlines()[-1]
        assert address.startswith("grpc://127.0.0.1:"), start.stdout
        yield address
    finally:
        running = _processes_of(state_dir) if (state_dir / "ports").exists() else []
        _script("stop", "--state_dir", str(state_dir))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(_alive(p) for p in running):
            time.sleep(0.5)
        assert not [p for p in running if _alive(p)], "processes left running after stop"
        assert not _processes_of(state_dir)


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> Iterator[dict[int, tuple[str, pathlib.Path]]]:
    """{workers: (address, state dir)} for services of 1 and 2 workers, started side by side."""
    root = tmp_path_factory.mktemp("data_service")
    with _service(root / "one", 1) as one, _service(root / "two", 2) as two:
        yield {1: (one, root / "one"), 2: (two, root / "two")}


@pytest.fixture(scope="module")
def photo_shards(tmp_path_factory) -> pathlib.Path:
    """The conversion job's shards of 72 real photos, 64 px JPEG, 4 shards (as test_reader_train_mirrored)."""
    from beam_jobs.sample_data import make_photo_tree

    root = tmp_path_factory.mktemp("service_photos")
    make_photo_tree(root / "photos", num_images=72, size=(500, 375), seed=3)
    convert = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(root / "photos"),
            "--output_dir",
            str(root / "shards"),
            "--image_size",
            "64",
            "--encoding",
            "jpeg",
            "--num_shards",
            "4",
            *IN_PROCESS,
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=600,
    )
    assert convert.returncode == 0, convert.stderr[-4000:]
    return root / "shards"


@pytest.mark.slow
@pytest.mark.cluster
def test_start_status_stop_leave_nothing_running(tmp_path: pathlib.Path) -> None:
    state_dir = tmp_path / "state"
    with _service(state_dir, 2):
        status = _script("status", "--state_dir", str(state_dir))
        assert status.stdout.count(": running") == 3, status.stdout
        assert len(_pids(state_dir)) == 3 and all(_alive(p) for p in _pids(state_dir))
        again = _script("start", "--state_dir", str(state_dir), check=False)
        assert again.returncode == 2 and "already running" in again.stderr
    assert _script("status", "--state_dir", str(state_dir), check=False).returncode == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["start", "--workers", "0"], "--workers must be at least 1"),
        (["start", "--workers", "2", "--worker_ports", "5001"], "--worker_ports has 1 port(s) for --workers 2"),
        (["start", "--dispatcher_port", "70000"], "--dispatcher_port must be a port number"),
        (["restart"], "unknown command 'restart'"),
        # "08" is eight (base 10), not an octal error that would start a service without workers.
        (["start", "--workers", "08", "--worker_ports", "5001"], "--worker_ports has 1 port(s) for --workers 8"),
    ],
)
def test_script_refuses_bad_arguments_with_one_line(tmp_path: pathlib.Path, args: list[str], message: str) -> None:
    proc = _script(*args, "--state_dir", str(tmp_path / "s"), check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "s" / "pid").exists() or not list((tmp_path / "s" / "pid").iterdir())


def _warm_reader(jpeg_dir: pathlib.Path) -> None:
    """TensorFlow's first start-up in this process (seconds on a cold, busy machine), done before a
    test starts its clock: what such a test times is the reader's refusal, not TensorFlow loading."""
    tf.constant(0).numpy()
    tfdata_readers.make_dataset(jpeg_dir, "train", 4)


def test_an_unreachable_or_malformed_address_fails_at_once_naming_it(jpeg_dir: pathlib.Path) -> None:
    _warm_reader(jpeg_dir)
    start = time.monotonic()
    # The evidence is the reason: refused, not "no answer within N s" (a deadline that ran out).
    with pytest.raises(
        ConnectionError, match=r"dispatcher grpc://127\.0\.0\.1:1 is unreachable \((?!no answer within)"
    ):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, data_service="grpc://127.0.0.1:1")
    assert time.monotonic() - start < 120  # TensorFlow's own client retried this address for minutes
    with pytest.raises(ValueError, match=r"data_service .*HOST:PORT.*got 'nohost'"):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, data_service="nohost")


def test_a_port_in_use_names_this_scripts_stop_command(tmp_path: pathlib.Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        proc = _script(
            "start", "--state_dir", str(tmp_path / "s"), "--dispatcher_port", str(held.getsockname()[1]), check=False
        )
    assert proc.returncode == 2 and "is in use" in proc.stderr, proc.stderr
    assert "launch/data_service.sh stop" in proc.stderr and "flink" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("address", ["http://127.0.0.1:5050", "ftp://x:1"])
def test_an_address_with_another_scheme_is_refused_naming_the_accepted_forms(jpeg_dir, address: str) -> None:
    with pytest.raises(ValueError, match=r"must be grpc://HOST:PORT or HOST:PORT \(got '(http|ftp)://"):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, data_service=address)


def test_a_server_that_is_not_a_dispatcher_fails_at_once_naming_it(jpeg_dir: pathlib.Path) -> None:
    """A port reused by another program (here an HTTP server) used to hang the reader silently."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"grpc://127.0.0.1:{server.server_address[1]}"
    try:
        _warm_reader(jpeg_dir)
        start = time.monotonic()
        # The reason is the evidence that it failed at once: what answered is named, where a
        # deadline that ran out would say "no answer within 60 s".
        with pytest.raises(ConnectionError, match="is unreachable .*not a tf.data dispatcher"):
            tfdata_readers.make_dataset(jpeg_dir, "train", 4, data_service=address, data_service_timeout_s=60)
        assert time.monotonic() - start < 120
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_standalone_worker_without_its_dispatcher_exits_with_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdata_readers.data_service_server",
            "--role",
            "worker",
            "--port",
            str(port),
            "--dispatcher_address",
            "127.0.0.1:1",
            "--dispatcher_timeout_s",
            "2",
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=120,
    )
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    # "gave up after 2 s" is the evidence that its own deadline ended the wait (the hard timeout
    # above only guards against a hang).
    assert "gave up after 2 s" in errors[0] and "127.0.0.1:1 is unreachable" in errors[0], proc.stderr
    assert "waiting for the tf.data service dispatcher at 127.0.0.1:1" in proc.stderr
    assert "RuntimeWarning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_refuses_what_the_service_cannot_guarantee(jpeg_dir: pathlib.Path) -> None:
    address = "grpc://127.0.0.1:1"  # refused before any connection is tried
    with pytest.raises(ValueError, match="training through the tf.data service needs num_epochs=None"):
        tfdata_readers.make_dataset(jpeg_dir, "train", 4, training=True, data_service=address)
    with pytest.raises(ValueError, match="data_service_sharding='static' is for evaluation"):
        tfdata_readers.make_dataset(
            jpeg_dir, "train", 4, training=True, num_epochs=None, data_service=address, data_service_sharding="static"
        )
    with pytest.raises(ValueError, match="skip_corrupt=True cannot be used with data_service"):
        tfdata_readers.ReadConfig(data_service=address, skip_corrupt=True)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("workers", [1, 2])
def test_exactly_once_through_the_service_under_mirrored_strategy(
    services, tmp_path: pathlib.Path, workers: int
) -> None:
    # 23 examples in 3 shards: not a multiple of the global batch, and shards the 2 workers split unevenly.
    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (23, 3)}, image_size=(16, 16))
    address, _ = services[workers]
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(_HERE / "data_service_check.py"), str(out), str(data_dir), address],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert sorted(results) == ["eval dynamic", "eval static", "train"]
    assert results == {"eval dynamic": [], "eval static": [], "train": []}


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("workers", [1, 2])
def test_every_global_step_through_the_service_is_whole(services, tmp_path: pathlib.Path, workers: int) -> None:
    # 3 examples, per-replica batch 1, 2 replicas: a pass is 3 batches, so a step made of any two
    # consecutive batches would straddle a pass every third step, and hold one example twice in a
    # third of those. A step must be one worker's group of batches from one pass, as the plain
    # reader's step is one slice of one epoch.
    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (3, 1)}, image_size=(16, 16))
    expected = set(reader_fixtures.expected_keys(data_dir, "train"))
    address, _ = services[workers]
    out = tmp_path / "steps.json"
    proc = subprocess.run(
        [sys.executable, str(_HERE / "data_service_steps_check.py"), str(out), str(data_dir), address, "90", "1"],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 90
    for number, replicas in enumerate(steps):
        keys = [k for batch in replicas for k in batch]
        assert [len(batch) for batch in replicas] == [1, 1], (number, replicas)  # a full batch per replica
        assert len(set(keys)) == len(keys), f"step {number} holds an example twice: {replicas}"
        assert set(keys) <= expected
    # At most once per pass, and every example still comes round.
    assert {k for replicas in steps for batch in replicas for k in batch} == expected


@pytest.mark.slow
@pytest.mark.cluster
def test_the_services_workers_decode_pillows_pixels(services, photo_shards) -> None:
    """The workers run the reader's own graph, its JPEG decode included: through the service, the
    converter's shards give Pillow's pixels of the stored bytes, exactly, as they do in process."""
    address, _ = services[2]
    want = reader_fixtures.pillow_pixels(photo_shards, "train")
    dataset = tfdata_readers.make_dataset(
        photo_shards, "train", 8, dtype="uint8", with_metadata=True, data_service=address
    )
    got = {
        key.decode(): pixels
        for image, _, meta in dataset
        for key, pixels in zip(meta["key"].numpy(), image.numpy(), strict=True)
    }
    assert sorted(got) == sorted(want)
    for key, pixels in got.items():
        assert np.array_equal(pixels, want[key]), key


@pytest.mark.slow
@pytest.mark.cluster
def test_train_mirrored_through_the_service_on_real_photos(services, photo_shards, tmp_path: pathlib.Path) -> None:
    address, _ = services[2]
    history_json = tmp_path / "history.json"
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(photo_shards),
            "--num_replicas",
            "2",
            "--global_batch_size",
            "16",
            "--epochs",
            "2",
            "--data_service",
            address,
            "--history_json",
            str(history_json),
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    history = json.loads(history_json.read_text())
    assert history["num_replicas"] == [2] and history["steps_per_epoch"] == [72 // 16]
    assert len(history["loss"]) == 2 and all(0 < v < 100 for v in history["loss"])
    assert f"input from the tf.data service at {address}" in train.stdout


@pytest.mark.slow
@pytest.mark.cluster
def test_train_mirrored_refuses_an_unreachable_service_with_one_line(photo_shards) -> None:
    train = subprocess.run(
        [
            sys.executable,
            str(_REPO / "launch" / "train_mirrored.py"),
            "--data_dir",
            str(photo_shards),
            "--num_replicas",
            "2",
            "--data_service",
            "grpc://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=300,
    )
    errors = [line for line in train.stderr.splitlines() if line.startswith("train_mirrored.py: error: ")]
    assert train.returncode == 2 and len(errors) == 1 and "grpc://127.0.0.1:1 is unreachable" in errors[0], train.stderr
    assert "Traceback" not in train.stderr


KILL_MODES = ("eval static", "eval dynamic", "train dynamic")


@pytest.fixture(scope="module")
def kill_results(services, tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("kill")
    # 400 examples in 8 shards, batches of 4: 100 batches, so the kill lands mid-epoch.
    data_dir = reader_fixtures.write_dataset(root / "data", splits={"train": (400, 8)}, image_size=(16, 16))
    address, state_dir = services[2]
    out = root / "results.json"
    # The timeout is only the hang check: each mode takes seconds (a restarted worker needs ~10 s),
    # many more on a cold, busy machine.
    proc = subprocess.run(
        [
            sys.executable,
            str(_HERE / "data_service_kill_check.py"),
            str(out),
            str(data_dir),
            address,
            str(state_dir / "pid" / "worker-1.pid"),
            *KILL_MODES,
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["eval static", "eval dynamic"])
def test_a_worker_killed_mid_evaluation_gives_exactly_once_or_a_clear_error(kill_results, mode: str) -> None:
    result = kill_results[mode]
    # That the epoch ended at all (completed, or this error) is the evidence it did not hang; how
    # soon after the kill is the machine's speed (a restarted worker loads TensorFlow again), and
    # kill_results' subprocess timeout is the hang guard.
    assert result["killed"], result
    if result["outcome"] == "completed":  # the worker had finished its part before it died
        assert result["delivered"] == result["distinct"] == result["expected"], result
    else:
        assert "did not deliver exactly the 400 examples" in result["error"], result
        assert "a service worker was lost during the epoch" in result["error"], result
        assert result["delivered"] != result["expected"] or result["distinct"] != result["expected"], result


@pytest.mark.slow
@pytest.mark.cluster
def test_a_worker_killed_mid_training_does_not_stop_the_stream(kill_results) -> None:
    result = kill_results["train dynamic"]
    assert result["killed"] and result["outcome"] == "completed", result
    assert result["full_batches"] and result["delivered"] == 150 * 4, result


@pytest.mark.slow
@pytest.mark.cluster
def test_two_trainer_workers_each_read_their_own_share_through_the_service(services, tmp_path: pathlib.Path) -> None:
    """MultiWorkerMirroredStrategy: each trainer registers its own record range as its own job, so
    the two trainers' evaluation epochs partition the split (12 + 11 of 23) through the service."""
    import socket

    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (23, 3)}, image_size=(16, 16))
    expected = sorted(reader_fixtures.expected_keys(data_dir, "train"))
    address, _ = services[2]
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("localhost", 0))
    trainers = [f"localhost:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": trainers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(_HERE / "data_service_multiworker.py"),
                    str(tmp_path / f"t{index}.json"),
                    str(data_dir),
                    address,
                ],
                env={**_ENV, "TF_CONFIG": json.dumps(tf_config)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [proc.communicate(timeout=600) for proc in procs]  # a hang guard only
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-4000:]
    seen = [json.loads((tmp_path / f"t{i}.json").read_text()) for i in range(2)]
    assert seen[0]["num_replicas_in_sync"] == 2
    for run in ("eval1", "eval2"):
        assert sorted(seen[0][run] + seen[1][run]) == expected, run
        assert sorted(len(seen[i][run]) for i in range(2)) == [11, 12], run
    # Training: every batch full (4 a replica), keys from the trainer's own share only.
    for i in range(2):
        assert len(seen[i]["train"]) == 4 * 4 and set(seen[i]["train"]) <= set(seen[i]["eval1"])


@pytest.mark.slow
@pytest.mark.cluster
def test_a_restarted_service_evaluates_relative_paths_and_small_splits_then_a_stop_ends_training(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One service, stopped and started again in the same state dir (the second start used to
    inherit the first's dispatcher journal, and static sharding failed: "Worker ... is not in the
    workers list"). Through it: a relative data dir (the workers' working directory is another:
    the reader used to hand them relative paths and hang), a one-shard split with two workers
    (static sharding cannot deal it; "auto" falls back to dynamic), and train_mirrored.py, which
    must end with one error line soon after the service is stopped under it (it used to wait forever)."""
    data_dir = reader_fixtures.write_dataset(
        tmp_path / "data", splits={"train": (24, 4), "validation": (7, 1)}, image_size=(16, 16)
    )
    state_dir = tmp_path / "state"
    with _service(state_dir, 2):
        pass
    with _service(state_dir, 2) as address:
        monkeypatch.chdir(tmp_path)
        from tfdata_readers.audit import epoch_keys

        for split in ("train", "validation"):
            dataset = tfdata_readers.make_dataset("data", split, 4, with_metadata=True, data_service=address)
            assert sorted(epoch_keys(dataset)) == sorted(reader_fixtures.expected_keys(data_dir, split)), split
        with pytest.raises(
            ValueError,
            match="data_service_sharding='static' needs at least one shard piece per "
            "tf.data service worker: .* gives this input pipeline 1, .* has 2 workers",
        ):
            tfdata_readers.make_dataset("data", "validation", 4, data_service=address, data_service_sharding="static")

        train = subprocess.Popen(
            [
                sys.executable,
                str(_REPO / "launch" / "train_mirrored.py"),
                "--data_dir",
                "data",
                "--num_replicas",
                "2",
                "--global_batch_size",
                "4",
                "--epochs",
                "10000",
                "--data_service",
                address,
                # 30 s: a live dispatcher on a busy machine may be slow to answer; a stopped one never does.
                "--data_service_timeout_s",
                "30",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**_ENV, "PYTHONUNBUFFERED": "1"},
        )
        try:
            # Stopped only once a whole epoch went through the service (Keras's epoch line), not
            # after a guessed number of seconds a busy machine may spend starting up.
            for marker in ("training on", " - loss: "):
                _read_until(train, marker)
            _script("stop", "--state_dir", str(state_dir))
            stopped = time.monotonic()
            _, err = train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
        # The watchdog's 30 s and its checks every 5 s, with room for a busy machine; it used to wait forever.
        assert time.monotonic() - stopped < 120
        errors = [line for line in err.splitlines() if line.startswith("train_mirrored.py: error: ")]
        assert train.returncode == 1 and len(errors) == 1, err[-3000:]
        assert f"dispatcher {address} has not answered for" in errors[0], errors


@pytest.mark.slow
@pytest.mark.cluster
def test_shards_the_workers_cannot_see_fail_at_start_up_naming_one(
    services, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard this process sees but the workers do not (here: removed between the reader's own
    check and the workers' check) used to hang the reader silently, TensorFlow retrying the open."""
    import tfdata_readers.stages.plan as pipeline

    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (8, 2)}, image_size=(16, 16))
    checked = pipeline.check_shards

    def check_then_hide_one(shards, **kwargs):
        checked(shards, **kwargs)
        os.remove(shards[1].path)

    tf.constant(0).numpy()  # TensorFlow's first start-up is not what this test is about
    monkeypatch.setattr(pipeline, "check_shards", check_then_hide_one)
    start = time.monotonic()
    # The error is the evidence: a reader that hung on the hidden shard would end, if at all, with
    # the check's ConnectionError, never this FileNotFoundError naming the shard.
    with pytest.raises(
        FileNotFoundError,
        match=r"workers at grpc://.* cannot see 1 of the 2 shard file\(s\), e\.g\. "
        r".*train-00001-of-00002.*readable on every worker at the same path",
    ):
        tfdata_readers.make_dataset(data_dir, "train", 4, data_service=services[2][0])
    assert time.monotonic() - start < 120


class _Waiting(logging.Handler):
    """Sets `seen` on the reader's record that the service has not yet started the shard path check."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "has not started the check of the shard paths" in record.getMessage():
            self.seen.set()


@pytest.mark.slow
@pytest.mark.cluster
def test_a_service_slow_to_start_the_path_check_is_waited_for_not_reported_blind(tmp_path: pathlib.Path) -> None:
    """The shard path check is the service's first job: TensorFlow registers it, the workers take
    it on their next heartbeat and load its kernels. On a cold, busy machine that start-up alone
    outran data_service_timeout_s, and a healthy service was reported as one whose workers do not
    run. Here the one worker is paused (SIGSTOP) until the reader has waited data_service_timeout_s
    for the job to start (its log record says so), then resumed: the check must then complete."""
    from tfdata_readers.service.reading import check_workers_see

    data_dir = reader_fixtures.write_dataset(tmp_path / "data", splits={"train": (8, 2)}, image_size=(16, 16))
    state_dir = tmp_path / "state"
    # A paused worker must stay in the dispatcher's list meanwhile, however long the machine takes.
    with _service(state_dir, 1, "--worker_timeout_ms", "600000") as address:
        waiting = _Waiting()
        logging.getLogger("tfdata_readers.service.reading").addHandler(waiting)
        worker = int((state_dir / "pid" / "worker-0.server").read_text().split()[0])
        outcome: dict[str, object] = {}

        def read() -> None:
            try:
                dataset = tfdata_readers.make_dataset(
                    data_dir, "train", 4, with_metadata=True, data_service=address, data_service_timeout_s=1
                )
                from tfdata_readers.audit import epoch_keys

                outcome["keys"] = sorted(epoch_keys(dataset))
            except Exception as e:  # asserted below, in the test's thread
                outcome["error"] = e

        os.kill(worker, signal.SIGSTOP)
        reader = threading.Thread(target=read, daemon=True)
        try:
            # Workers that never take the job (all hung) still fail, after the start-up allowance.
            with pytest.raises(
                ConnectionError,
                match=r"did not run a check of the shard paths within 2 s, though its "
                r"dispatcher answered .*launch/data_service.sh status",
            ):
                check_workers_see(address, [str(data_dir)], 1, start_up_s=2)
            waiting.seen.clear()  # that check's record: the reader's own is awaited next
            reader.start()
            while not waiting.seen.wait(0.2):  # until the reader waited its 1 s, or gave up
                assert reader.is_alive(), outcome
        finally:
            os.kill(worker, signal.SIGCONT)
            logging.getLogger("tfdata_readers.service.reading").removeHandler(waiting)
        reader.join(300)
        assert not reader.is_alive(), "the reader did not finish after the worker resumed"
    assert "error" not in outcome, outcome["error"]
    assert outcome["keys"] == sorted(reader_fixtures.expected_keys(data_dir, "train"))


def test_the_dispatchers_worker_list_is_read_from_its_answer() -> None:
    from tfdata_readers.service.dispatcher import _worker_addresses

    # GetWorkersResponse as a 2-worker dispatcher of TensorFlow 2.21 sent it.
    answer = b"\n\x11\n\x0f127.0.0.1:44329\n\x11\n\x0f127.0.0.1:37001"
    assert _worker_addresses(answer) == ["127.0.0.1:44329", "127.0.0.1:37001"]
    assert _worker_addresses(b"") == []


def test_the_watchdog_reports_a_dispatcher_that_stopped_answering_once() -> None:
    from tfdata_readers.service.dispatcher import DispatcherWatchdog

    lost: list[str] = []
    with DispatcherWatchdog("grpc://127.0.0.1:1", timeout_s=0.6, on_lost=lost.append, prefix="x: error: ") as watchdog:
        deadline = time.monotonic() + 120
        while not lost and time.monotonic() < deadline:
            time.sleep(0.1)
        # Once: its thread ends after the report (so no second one can come), however slow the machine.
        watchdog._thread.join(120)
        assert not watchdog._thread.is_alive()
    assert len(lost) == 1 and lost[0].startswith(
        "x: error: the tf.data service dispatcher grpc://127.0.0.1:1 has not answered for"
    ), lost

"""What each install holds: converting needs no TensorFlow, and every command answers --help at once.

TensorFlow is the [read] extra. A machine without it is imitated the way Python sees one: a
``tensorflow`` package whose import raises ModuleNotFoundError, first on the path of the job and of
its worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from tests.conftest import REPO

_HEAVY = ("apache_beam", "tensorflow")


def _requirements() -> list[str]:
    return metadata.requires("images-to-tfrecords") or []


def test_tensorflow_is_the_read_extra_not_a_core_requirement():
    tensorflow = [r for r in _requirements() if r.startswith("tensorflow")]
    assert tensorflow and all("extra ==" in r for r in tensorflow), tensorflow
    assert any('extra == "read"' in r for r in tensorflow) and any('extra == "test"' in r for r in tensorflow)
    core = [r for r in _requirements() if "extra ==" not in r]
    assert any(r.startswith("apache-beam") for r in core) and any(r.startswith("pillow") for r in core)


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "tfdata_readers.verify"],
        ["-m", "tfdata_readers.inspect"],
        ["-m", "tfdata_readers.data_service_server"],
        [str(REPO / "launch" / "train_mirrored.py")],
    ],
    ids=["verify", "inspect", "data_service_server", "train_mirrored"],
)
@pytest.mark.parametrize("args", [["--help"], ["--no_such_flag", "x"]], ids=["help", "bad-flag"])
def test_the_reader_commands_answer_before_importing_tensorflow(command, args):
    code = (
        "import runpy, sys\nsys.argv = [sys.argv[1], *sys.argv[2:]]\ntry:\n"
        "    runpy.run_module(sys.argv[0], run_name='__main__') if not sys.argv[0].endswith('.py') else "
        "runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as e:\n"
        f"    print('IMPORTED', [m for m in {_HEAVY!r} if m in sys.modules], file=sys.stderr)\n    raise\n"
    )
    target = command[-1]
    done = subprocess.run(
        [sys.executable, "-c", code, target, *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == (0 if args == ["--help"] else 2), done.stderr[-2000:]
    assert "IMPORTED []" in done.stderr, done.stderr[-2000:]
    if args == ["--help"]:
        assert "usage:" in done.stdout


@pytest.fixture()
def without_tensorflow(tmp_path) -> dict[str, str]:
    """An environment in which `import tensorflow` fails as it does where it is not installed."""
    site = tmp_path / "no-tensorflow"
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n"
    )
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


@pytest.mark.slow
def test_converting_needs_no_tensorflow_and_the_reader_says_how_to_get_it(photo_tree, tmp_path, without_tensorflow):
    root, good, _ = photo_tree
    out = tmp_path / "out"
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_jobs",
            "--input",
            str(root),
            "--output_dir",
            str(out),
            "--image_size",
            "32",
            "--max_bad_fraction",
            "0.5",
            "--direct_num_workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=without_tensorflow,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    info = json.loads((out / "dataset_info.json").read_text())
    assert sum(s["num_examples"] for s in info["splits"].values()) == len(good)
    verify = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_tensorflow,
        cwd=tmp_path,
    )
    assert verify.returncode == 2
    assert verify.stderr.strip().splitlines() == [
        "verify-tfrecords: error: this command needs TensorFlow, which the reader's extra installs: "
        "pip install 'images-to-tfrecords[read]' (from a clone: pip install '.[read]'), or install your own "
        "TensorFlow build, 2.21 or later"
    ]
    train = subprocess.run(
        [sys.executable, str(REPO / "launch" / "train_mirrored.py"), "--data_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_tensorflow,
        cwd=tmp_path,
    )
    assert train.returncode == 2 and "needs TensorFlow" in train.stderr and "Traceback" not in train.stderr
    library = subprocess.run(
        [sys.executable, "-c", "import tfdata_readers as tr\ntr.make_dataset"],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_tensorflow,
        cwd=tmp_path,
    )
    assert library.returncode == 1
    assert "ModuleNotFoundError: tfdata_readers.make_dataset needs TensorFlow" in library.stderr
    assert "images-to-tfrecords[read]" in library.stderr


def test_the_packages_functions_are_not_shadowed_by_modules_of_the_same_name():
    """Importing a submodule sets the package's attribute of its name: no module may share a name
    with a function the package exports (beam_jobs.convert, tfdata_readers.verify) and be imported by
    the library. (`python -m tfdata_readers.verify` runs a module of that name, in its own process.)"""
    code = (
        "import inspect, beam_jobs.pipeline, tfdata_readers.checking.verification, tfdata_readers.inspect\n"
        "import beam_jobs, tfdata_readers\n"
        "print(inspect.isfunction(beam_jobs.convert), inspect.isfunction(tfdata_readers.verify))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]


def test_the_readers_public_names_are_each_found_in_their_module():
    import tfdata_readers

    assert sorted(tfdata_readers.__all__) == sorted(tfdata_readers._HOMES)  # pylint: disable=protected-access
    for name in tfdata_readers.__all__:
        assert getattr(tfdata_readers, name).__name__ == name


def test_the_documented_service_paths_are_the_service_modules():
    """`python -m tfdata_readers.data_service_server` and `tfdata_readers.dispatcher_client`, the
    paths docs/data-service.md and launch/data_service.sh use, are the code in service/."""
    from tfdata_readers import data_service_server, dispatcher_client
    from tfdata_readers.service import dispatcher, server

    assert data_service_server.main is server.main
    assert dispatcher_client.DispatcherWatchdog is dispatcher.DispatcherWatchdog


# --- The set-up of ./run_tests.sh (.ci/install_test_prerequisites.sh) and the scripts' environment.

_SET_UP = REPO / ".ci" / "install_test_prerequisites.sh"
# What the set-up script itself runs: a PATH of these and nothing else is a machine without Java,
# Maven, apt-get, sudo or a browser.
_BASE_TOOLS = ("bash", "sh", "env", "mkdir", "rm", "cat", "dirname", "tail", "grep", "sed", "head", "timeout", "id")


def _bare_machine(tmp_path) -> dict[str, str]:
    """A fresh HOME and cache, and a PATH holding only the shell tools the set-up needs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in _BASE_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return {"HOME": str(tmp_path / "home"), "PATH": str(bin_dir), "IMAGES_TO_TFRECORDS_CACHE": str(tmp_path / "cache")}


def test_the_test_set_up_says_in_one_line_what_it_cannot_have_and_the_fixtures_fail_with_it(tmp_path):
    """On a machine without Java, Maven, a browser and apt-get, ./run_tests.sh's set-up prints one
    line per missing prerequisite, naming what to install, and keeps it for the fixtures."""
    env = _bare_machine(tmp_path)
    done = subprocess.run(
        [str(_SET_UP), "flink", "spark", "chromium"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    flink = [line for line in lines if "Flink" in line]
    spark = [line for line in lines if "Spark" in line]
    chromium = [line for line in lines if "Chromium" in line]
    assert len(flink) == 1 and len(spark) == 1 and len(chromium) == 1 and len(lines) == 3, done.stderr
    for line in (flink[0], spark[0]):
        assert "Java is missing" in line and "apt-get install openjdk-17-jdk-headless maven" in line
    assert spark[0].startswith("[run_tests] Spark and Beam's Spark job server (for the Spark tests) cannot be had")
    assert "no apt-get on this machine" in chromium[0] and "chromium-headless-shell" in chromium[0]
    assert all("the tests that need it fail naming it" in line for line in lines)
    kept = tmp_path / "cache" / "test-prerequisites"
    assert (kept / "flink.missing").read_text().strip() == flink[0].removeprefix("[run_tests] ")
    assert (kept / "spark.missing").read_text().strip() == spark[0].removeprefix("[run_tests] ")


def test_an_object_store_fixture_fails_with_the_set_ups_line_instead_of_building(tmp_path, monkeypatch):
    """Where ./run_tests.sh's set-up could not build MinIO, its fixture fails at once with that
    line: it does not start a build that pytest's per-test limit would kill without a word."""
    from tests.objectstores.conftest import server_binary

    line = "MinIO and fake-gcs-server cannot be had: Go is missing; the tests that need it fail naming it"
    (tmp_path / "object-stores.missing").write_text(line + "\n")
    monkeypatch.setenv("IMAGES_TO_TFRECORDS_PREREQUISITES", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # a build attempt would fail otherwise, differently
    with pytest.raises(pytest.fail.Exception) as failed:
        server_binary("minio")
    assert str(failed.value) == line


def _stamped_venv(folder, extras: str):
    """A virtual environment that launch/ensure_venv.sh takes for installed with ``extras``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    installed = (REPO / "setup.py").read_bytes() + (REPO / "launch" / "tested-versions.txt").read_bytes()
    setup_hash = hashlib.sha256(installed).hexdigest()[:16]
    (folder / f".installed-{setup_hash}-{extras}").touch()
    return folder


def test_ensure_venv_uses_the_active_virtual_environment(tmp_path):
    """A user who made and activated an environment (the README's Install section) gets it used by
    run_local.sh and run_tests.sh, not a second one in ./.venv."""
    active = _stamped_venv(tmp_path / "mine", "samples")
    env = {**os.environ, "VIRTUAL_ENV": str(active)}
    env.pop("VENV", None)
    done = subprocess.run(
        [str(REPO / "launch" / "ensure_venv.sh"), "samples"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(active / "bin" / "python")
    # $VENV still wins, and a stale VIRTUAL_ENV (its environment deleted) is one line, not a new venv.
    chosen = _stamped_venv(tmp_path / "chosen", "samples")
    done = subprocess.run(
        [str(REPO / "launch" / "ensure_venv.sh"), "samples"],
        env={**env, "VENV": str(chosen)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == str(chosen / "bin" / "python"), done.stderr
    gone = tmp_path / "deleted"
    done = subprocess.run(
        [str(REPO / "launch" / "ensure_venv.sh"), "samples"],
        env={**env, "VIRTUAL_ENV": str(gone)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and not gone.exists(), done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: VIRTUAL_ENV={gone} has no bin/python: activate an existing environment, or run 'deactivate' "
        "to use ./.venv"
    ]


# The lines TensorFlow's native code prints while it is imported, without their time stamps.
_NATIVE_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")


def test_train_mirrored_shows_tensorflows_start_up_lines_once(tmp_path):
    """They came twice: two of TensorFlow's native modules each print the banner and the CUDA stub's
    line when they load. Each is shown once (a missing dataset ends the run right after the import)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "launch" / "train_mirrored.py"), "--data_dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [_NATIVE_LINE.sub("", line) for line in done.stderr.splitlines()]
    repeated = sorted({line for line in lines if lines.count(line) > 1})
    assert not repeated, done.stderr[-3000:]
    assert sum("absl::InitializeLog" in line for line in lines) <= 1
    assert any(line.startswith("train_mirrored.py: error: ") for line in lines), done.stderr[-3000:]


@pytest.mark.slow
def test_run_local_converts_in_the_active_environment(tmp_path, photo_tree):
    """The README's first command: launch/run_local.sh runs the job in the active environment."""
    root, good, _ = photo_tree
    env = {**os.environ, "VIRTUAL_ENV": sys.prefix}
    env.pop("VENV", None)
    out = tmp_path / "out"
    done = subprocess.run(
        [str(REPO / "launch" / "run_local.sh"), "--input", str(root), "--output_dir", str(out), "--image_size", "32"]
        + ["--max_bad_fraction", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == len(good)

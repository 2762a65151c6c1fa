"""What each install holds: converting needs no TensorFlow, and every command answers --help at once.

TensorFlow is the [read] extra. A machine without it is imitated the way Python sees one: a
``tensorflow`` package whose import raises ModuleNotFoundError, first on the path of the job and of
its worker processes.
"""

from __future__ import annotations

import json
import os
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

"""Dataflow readiness without GCP: the sdist builds and works in a clean venv, the pipeline pickles
with Beam's default pickler without save_main_session, and the launch scripts' commands parse."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from tests.cluster.conftest import JOB_FLAGS, LAUNCH, REPO_ROOT, assert_same_output, job_env, run_script

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> pathlib.Path:
    dist = tmp_path_factory.mktemp("dist")
    run_script([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], timeout=300)
    (archive,) = dist.glob("images[-_]to[-_]tfrecords-*.tar.gz")  # setuptools < 69 keeps the dashes
    return archive


@pytest.fixture(scope="module")
def clean_venv(sdist, tmp_path_factory) -> pathlib.Path:
    """A new venv holding only the sdist. Its third-party dependencies (TensorFlow, Beam: ~2 GB)
    come from this test run's site-packages through a .pth line, so nothing is downloaded; a plain
    path line adds that folder after the venv's own site-packages and does not run its .pth files,
    so an editable install of the repo there cannot shadow the installed sdist."""
    venv = tmp_path_factory.mktemp("venv") / "clean"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = pathlib.Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "_deps_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            str(sdist),
        ],
        check=True,
        timeout=300,
        cwd=venv,
    )
    return venv


def _venv_run(venv: pathlib.Path, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = job_env()
    env.pop("PYTHONPATH")  # nothing from the repo
    env["PATH"] = str(venv / "bin") + ":" + env["PATH"]
    env["PYTHON"] = str(venv / "bin" / "python")
    return subprocess.run(args, env=env, cwd=venv, capture_output=True, text=True, **kwargs)


def test_sdist_contains_the_packages(sdist):
    import tarfile

    names = tarfile.open(sdist).getnames()
    for needed in ("beam_jobs/__init__.py", "beam_jobs/writing/convert_shards.py", "beam_jobs/pipeline.py", "setup.py"):
        assert any(name.endswith(needed) for name in names), needed


def test_clean_venv_imports_the_dofns_from_the_sdist(clean_venv):
    probe = textwrap.dedent("""
        import inspect, pathlib, pickle, sys
        import apache_beam as beam
        import beam_jobs, beam_jobs.writing.convert_shards, beam_jobs.pipeline
        assert pathlib.Path(beam_jobs.__file__).is_relative_to(sys.prefix), beam_jobs.__file__
        dofns = [c for _, c in inspect.getmembers(beam_jobs.writing.convert_shards, inspect.isclass)
                 if issubclass(c, beam.DoFn) and c.__module__.startswith("beam_jobs")]
        assert dofns, "no DoFn in beam_jobs.writing.convert_shards"
        print("ok", beam_jobs.__file__, [c.__name__ for c in dofns])
    """)
    proc = _venv_run(clean_venv, [str(clean_venv / "bin" / "python"), "-c", probe], timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ConvertShardFn" in proc.stdout
    assert (clean_venv / "bin" / "images-to-tfrecords").exists()


@pytest.mark.timeout(400)
def test_clean_venv_converts_like_the_repo(clean_venv, photo_tree, local_output, tmp_path):
    # What a Dataflow worker does: install the package, run its DoFns; same bytes as the repo's run.
    out = tmp_path / "out"
    proc = _venv_run(
        clean_venv,
        [
            str(clean_venv / "bin" / "images-to-tfrecords"),
            "--input",
            str(photo_tree),
            "--output_dir",
            str(out),
            *JOB_FLAGS,
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_same_output(out, local_output)


def test_pipeline_pickles_with_the_default_pickler(photo_tree, tmp_path):
    proto_path = tmp_path / "pipeline.pb"
    build = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        os.environ["CAPTURE_RUNNER_PROTO"] = {str(proto_path)!r}
        from apache_beam.internal import pickler
        from beam_jobs.pipeline import run
        assert pickler.DEFAULT_PICKLE_LIB == "cloudpickle"
        try:
            run(["--runner=_capture_runner.CaptureRunner", "--input", {str(photo_tree)!r},
                 "--output_dir", {str(tmp_path / "out")!r}, "--image_size", "224"])
        except (FileNotFoundError, OSError):
            pass  # nothing ran, so there is no dataset_info.json to read back
    """)
    run_script([sys.executable, "-c", build], timeout=180)
    assert proto_path.stat().st_size > 0
    # A fresh process with a different __main__ unpickles every DoFn: nothing needs save_main_session.
    load = textwrap.dedent(f"""
        from apache_beam.internal import pickler
        from apache_beam.portability import common_urns
        from apache_beam.portability.api import beam_runner_api_pb2
        from apache_beam.portability import python_urns
        proto = beam_runner_api_pb2.Pipeline.FromString(open({str(proto_path)!r}, "rb").read())
        names = []
        for transform in proto.components.transforms.values():
            if transform.spec.urn == common_urns.primitives.PAR_DO.urn:
                payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
                if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
                    continue
                fn = pickler.loads(payload.do_fn.payload)
                fn = fn[0] if isinstance(fn, tuple) else fn
                names.append(type(getattr(fn, "fn", fn)).__name__)
        print(len(names), sorted(set(names)))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", load], env=job_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    count = int(proc.stdout.split()[0])
    assert count > 0 and "ConvertShardFn" in proc.stdout, proc.stdout


def _dataflow_args(**overrides) -> list[str]:
    args = {
        "--project": "my-project",
        "--region": "europe-west1",
        "--temp_location": "gs://my-bucket/tmp",
        "--machine_type": "n2-standard-4",
        "--num_workers": "4",
        "--sdk_container_image": "europe-docker.pkg.dev/my-project/beam/images-to-tfrecords:0.1.0",
    }
    args.update(overrides)
    return [x for kv in args.items() for x in kv if kv[1] is not None]


def test_submit_dataflow_dry_run_prints_a_command_beam_accepts():
    proc = run_script(
        [
            str(LAUNCH / "submit_dataflow.sh"),
            "--dry-run",
            *_dataflow_args(),
            "--input",
            "gs://my-bucket/images",
            "--output_dir",
            "gs://my-bucket/tfrecords",
            "--image_size",
            "224",
            "--num_shards",
            "64",
        ],
        timeout=120,
    )
    command = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert command[1:3] == ["-m", "beam_jobs"]
    assert f"--setup_file={REPO_ROOT / 'setup.py'}" in command
    check = textwrap.dedent("""
        import sys
        from apache_beam.options.pipeline_options import (
            GoogleCloudOptions, PipelineOptions, SetupOptions, StandardOptions, WorkerOptions)
        from beam_jobs.command_line.options import ConversionOptions
        o = PipelineOptions(sys.argv[1:])
        g, w, s = o.view_as(GoogleCloudOptions), o.view_as(WorkerOptions), o.view_as(SetupOptions)
        assert o.view_as(StandardOptions).runner == "DataflowRunner"
        assert (g.project, g.region) == ("my-project", "europe-west1")
        assert g.temp_location == "gs://my-bucket/tmp" and g.staging_location == "gs://my-bucket/tmp/staging"
        assert s.setup_file.endswith("setup.py") and not s.save_main_session
        assert (w.machine_type, w.num_workers) == ("n2-standard-4", 4)
        assert w.sdk_container_image.endswith("images-to-tfrecords:0.1.0")
        c = o.view_as(ConversionOptions)
        assert (c.input, c.output_dir, c.num_shards) == ("gs://my-bucket/images", "gs://my-bucket/tfrecords", 64)
        print("parsed")
    """)
    parsed = run_script([sys.executable, "-c", check, *command[3:]], timeout=120)
    assert "parsed" in parsed.stdout


@pytest.mark.parametrize(
    "bad",
    [
        {"--temp_location": "/local/tmp"},
        {"--project": None},
        {"--project": "My Project"},
        {"--num_workers": "zero"},
    ],
)
def test_submit_dataflow_dry_run_rejects_bad_arguments(bad):
    proc = run_script(
        [
            str(LAUNCH / "submit_dataflow.sh"),
            "--dry-run",
            *_dataflow_args(**bad),
            "--input",
            "gs://b/i",
            "--output_dir",
            "gs://b/o",
        ],
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0


def test_submit_dataflow_dry_run_rejects_unknown_job_flags():
    proc = run_script(
        [
            str(LAUNCH / "submit_dataflow.sh"),
            "--dry-run",
            *_dataflow_args(),
            "--input",
            "gs://b/i",
            "--output_dir",
            "gs://b/o",
            "--num_shardz",
            "3",
        ],
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0 and "num_shardz" in proc.stderr


def test_submit_flink_dry_run_defaults_match_flink_cluster_sh():
    proc = run_script(
        [str(LAUNCH / "submit_flink.sh"), "--dry-run", "--input", "/data/images", "--output_dir", "/data/out"],
        timeout=60,
    )
    command = shlex.split(proc.stdout.strip().splitlines()[-1])
    check = textwrap.dedent("""
        import sys
        from apache_beam.options.pipeline_options import (
            FlinkRunnerOptions, PipelineOptions, PortableOptions, StandardOptions)
        o = PipelineOptions(sys.argv[1:])
        f, p = o.view_as(FlinkRunnerOptions), o.view_as(PortableOptions)
        assert o.view_as(StandardOptions).runner == "FlinkRunner"
        assert (f.flink_master, f.flink_version, f.parallelism) == ("127.0.0.1:8081", "1.19", 2)
        assert f.flink_job_server_jar.endswith("beam-runners-flink-1.19-job-server-2.62.0.jar")
        assert (p.environment_type, p.environment_config) == ("EXTERNAL", "127.0.0.1:50000")
        print("parsed")
    """)
    assert "parsed" in run_script([sys.executable, "-c", check, *command[3:]], timeout=60).stdout


def test_submit_flink_docker_environment_names_the_sdk_image():
    proc = run_script(
        [
            str(LAUNCH / "submit_flink.sh"),
            "--dry-run",
            "--environment_type",
            "DOCKER",
            "--flink_master",
            "flink.example:8081",
            "--parallelism",
            "8",
            "--",
            "--input",
            "x",
            "--output_dir",
            "y",
        ],
        timeout=60,
    )
    line = proc.stdout.strip().splitlines()[-1]
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"--environment_config=apache/beam_python{py}_sdk:2.77.0" in line
    assert "--parallelism=8" in line and "--flink_master=flink.example:8081" in line


@pytest.mark.parametrize(
    "args",
    [
        ["--environment_type", "LOOPBACK"],
        ["--parallelism", "0"],
        ["--flink_version", "1.17"],
        ["--flink_master", "http//bad"],
        ["--environment_type", "PROCESS"],
    ],
)
def test_submit_flink_rejects_bad_arguments(args):
    proc = run_script([str(LAUNCH / "submit_flink.sh"), "--dry-run", *args], timeout=60, check=False)
    assert proc.returncode != 0 and "error:" in proc.stderr


@pytest.mark.parametrize("script", ["flink_cluster.sh", "submit_flink.sh", "submit_dataflow.sh", "run_portable.sh"])
def test_scripts_have_help(script):
    proc = run_script([str(LAUNCH / script), "--help"], timeout=30)
    assert proc.stdout.startswith("Usage: launch/" + script)


# A program on PATH that every python of the dry run imports first: it records each attempt to
# open a connection, through an audit hook that no later code can remove.
_NETWORK_RECORDER = """
import os, sys
def _record(event, args):
    if event in ("socket.connect", "socket.getaddrinfo"):
        with open(os.environ["NETWORK_LOG"], "a") as log:
            log.write(f"{event} {args[1]!r}\\n")
sys.addaudithook(_record)
"""


def _offline_dry_run(tmp_path, args: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_NETWORK_RECORDER)
    log = tmp_path / "network.log"
    log.write_text("")
    env = job_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    env["NETWORK_LOG"] = str(log)
    proc = subprocess.run(
        [str(LAUNCH / "submit_dataflow.sh"), "--dry-run", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, log.read_text()


@pytest.mark.parametrize("temp_location", ["gs://my-bucket/tmp", "gs://b/tmp"])
def test_submit_dataflow_dry_run_makes_no_network_call(temp_location, tmp_path):
    # Beam's validator asked GCS about the buckets (minutes of timeouts), and for gs://b/tmp (an
    # invalid bucket name) tried to create a default bucket and crashed with a long traceback.
    proc, network = _offline_dry_run(
        tmp_path,
        [
            *_dataflow_args(**{"--temp_location": temp_location}),
            "--input",
            "gs://my-bucket/i",
            "--output_dir",
            "gs://my-bucket/o",
        ],
    )
    assert network == "", f"the dry run reached for the network:\n{network}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if temp_location == "gs://b/tmp":
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1].startswith("[submit_dataflow.sh] error: invalid Dataflow arguments")
        assert "gs://b/tmp" in proc.stderr.strip().splitlines()[-1]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "job_args, message",
    [
        (["--input", "gs://b/i", "--output_dir", "gs://b/o", "--image_size", "abc"], "--image_size"),
        (["--input", "gs://b/i", "--output_dir", "gs://b/o", "--num_shards=-3"], "--num_shards"),
        (["--output_dir", "gs://b/o"], "--input"),
    ],
)
def test_submit_dataflow_dry_run_runs_the_jobs_own_argument_checks(job_args, message, tmp_path):
    proc, network = _offline_dry_run(tmp_path, [*_dataflow_args(), *job_args])
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("images-to-tfrecords: error:") and message in last, proc.stderr[-3000:]
    assert network == ""

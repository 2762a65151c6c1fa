"""The Python API: ``beam_jobs.convert`` is the command line as a call, ``ConvertImages`` works in a
user's own pipeline, and importing the packages costs no Beam or TensorFlow import."""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.runners.portability import fn_api_runner

import beam_jobs
import tfdata_readers
from beam_jobs.api import convert_argv, in_keyword_terms
from beam_jobs.command_line.arguments import parse_job_arguments
from beam_jobs.command_line.flags import help_parser
from beam_jobs.config import ImageConfig
from tests.conftest import REPO, run_cli

# Flags of --help that are not keyword arguments: -h itself, -v (log_level says it in words) and
# --version (beam_jobs.__version__ says it).
_NOT_KEYWORDS = {"help", "verbosity", "version"}


def _flag_defaults() -> dict[str, object]:
    return {a.dest: a.default for a in help_parser()._actions if a.dest not in _NOT_KEYWORDS}  # pylint: disable=protected-access


def test_convert_takes_exactly_the_command_lines_flags_with_their_defaults():
    parameters = dict(inspect.signature(beam_jobs.convert).parameters)
    parameters.pop("beam_options")
    parameters.pop("spec")  # the whole spec instead of the keywords
    flags = _flag_defaults()
    assert set(parameters) == set(flags)
    for name, parameter in parameters.items():
        assert parameter.annotation is not inspect.Parameter.empty, name
        if parameter.default is None or parameter.default is inspect.Parameter.empty:
            continue  # None: the flag's own default, whatever it is; output_dir: required
        default = flags[name]
        if name == "image_size":
            default = int(default)
        assert parameter.default == default, name


def test_the_call_parses_as_the_same_command_line_would():
    argv = convert_argv(
        {
            "input": "/data/photos",
            "output_dir": "/data/out",
            "splits": {"train": 0.8, "test": 0.2},
            "image_size": (64, 48),
            "overwrite": True,
            "resume": False,
            "max_pixels": None,
        },
        {"direct_num_workers": 2},
    )
    assert argv == [
        "--input=/data/photos",
        "--output_dir=/data/out",
        "--splits=train=0.8,test=0.2",
        "--image_size=64x48",
        "--overwrite",
        "--direct_num_workers=2",
    ]
    from_call, options = parse_job_arguments(argv)
    from_line, _ = parse_job_arguments(
        [
            "--input",
            "/data/photos",
            "--output_dir",
            "/data/out",
            "--splits",
            "train=0.8,test=0.2",
            "--image_size",
            "64x48",
            "--overwrite",
        ]
    )
    assert from_call == from_line
    assert options.get_all_options()["direct_num_workers"] == 2
    with pytest.raises(TypeError, match="mapping or a list"):
        convert_argv({}, "--direct_num_workers=2")


@pytest.mark.parametrize(
    ("arguments", "beam_options", "message"),
    [
        ({"overwrite": "no"}, None, "overwrite must be True or False"),
        ({"resume": 1}, None, "resume must be True or False"),
        ({"image_size": True}, None, "image_size takes a value"),
        ({"image_size": (64,)}, None, "a pair"),
        ({}, ["--help"], "takes no --help"),
        ({}, ["-h"], "takes no --help"),
    ],
)
def test_values_the_command_line_could_not_express_are_refused_by_name(arguments, beam_options, message):
    with pytest.raises(beam_jobs.UsageError, match=message):
        convert_argv({"input": "/p", "output_dir": "/o", **arguments}, beam_options)


def test_importing_the_packages_imports_neither_beam_nor_tensorflow():
    code = (
        "import sys, beam_jobs, tfdata_readers\nbeam_jobs.convert; beam_jobs.UsageError\n"
        "print([m for m in ('apache_beam', 'tensorflow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_refused_argument_raises_usage_error_and_writes_nothing(tmp_path, photo_tree):
    root = photo_tree[0]
    with pytest.raises(beam_jobs.UsageError, match="jpeg_quality"):
        beam_jobs.convert(str(root), output_dir=str(tmp_path / "out"), jpeg_quality=0)
    assert not (tmp_path / "out").exists()


def _shard_bytes(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shards/*/*.tfrecord"))}


@pytest.mark.slow
def test_convert_returns_the_manifest_and_writes_what_the_command_line_writes(tmp_path, photo_tree):
    root, good, broken = photo_tree
    # The caller's own logging (a notebook's, an application's) is as it was after the call.
    root_logger = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    mine.setFormatter(logging.Formatter("mine: %(message)s"))
    before = (list(root_logger.handlers), root_logger.level)
    root_logger.addHandler(mine)
    root_logger.setLevel(logging.INFO)
    try:
        info = beam_jobs.convert(
            str(root),
            output_dir=str(tmp_path / "api"),
            image_size=(40, 32),
            splits={"train": 0.75, "validation": 0.25},
            max_bad_fraction=0.5,
            beam_options={"direct_num_workers": 2},
        )
        assert root_logger.handlers == [*before[0], mine] and root_logger.level == logging.INFO
        assert mine.formatter._fmt == "mine: %(message)s" and not mine.filters
        logging.getLogger("after").info("still mine")
        assert "mine: still mine" in mine.stream.getvalue()
    finally:
        root_logger.removeHandler(mine)
        root_logger.setLevel(before[1])
    # The reader's own type, equal to what the reader reads back, with the JSON as written.
    assert isinstance(info, tfdata_readers.DatasetInfo)
    assert info == tfdata_readers.load_manifest(tmp_path / "api")
    assert info.to_json() == dict(info) == json.loads((tmp_path / "api" / "dataset_info.json").read_text())
    assert info.splits["train"].num_examples == info["splits"]["train"]["num_examples"]
    assert sum(s["num_examples"] for s in info["splits"].values()) == len(good)
    assert info["num_dead_letters"] == len(broken)
    run_cli(
        "--input",
        root,
        "--output_dir",
        tmp_path / "cli",
        "--image_size",
        "40x32",
        "--splits",
        "train=0.75,validation=0.25",
        "--max_bad_fraction",
        "0.5",
        "--direct_num_workers",
        "2",
    )
    api, cli = _shard_bytes(tmp_path / "api"), _shard_bytes(tmp_path / "cli")
    assert api and api == cli
    # The same conversion as one spec, given whole: the same bytes again.
    spec = beam_jobs.ConversionSpec(
        source=beam_jobs.Source(root=str(root)),
        output_dir=str(tmp_path / "spec"),
        image=ImageConfig(width=40, height=32),
        splits=beam_jobs.SplitSpec(fractions={"train": 0.75, "validation": 0.25}),
        limits=beam_jobs.Limits(max_bad_fraction=0.5),
        runner_args=("--direct_num_workers=2",),
    )
    from_spec = beam_jobs.convert(spec=spec)
    assert {s: v["class_counts"] for s, v in from_spec["splits"].items()} == {
        s: v["class_counts"] for s, v in info["splits"].items()
    }
    assert _shard_bytes(tmp_path / "spec") == api
    with pytest.raises(beam_jobs.UsageError, match="a spec or keywords, not both .got spec and overwrite"):
        beam_jobs.convert(spec=spec, overwrite=True)


@pytest.mark.slow
def test_convert_images_converts_a_pcollection_of_rows_in_a_users_pipeline(tmp_path, photo_tree):
    """What reading the rows from BigQuery (beam.io.ReadFromBigQuery) and converting them looks like:
    rows with uri and label, relative to rows_root; a bad row is a dead letter, not a failure."""
    root, good, _ = photo_tree
    rows = [{"uri": str(pathlib.Path(p).relative_to(root)), "label": pathlib.Path(p).parent.name} for p in good]
    bad_rows = [
        {"uri": "nowhere/missing.jpg", "label": ""},  # a blank label: refused by the naming policy
        {"uri": rows[0]["uri"], "label": b"cat"},  # bytes: str() would make a class named "b'cat'"
        "cat/1.jpg",  # not a mapping
        None,
    ]
    with beam.Pipeline(runner=fn_api_runner.FnApiRunner()) as pipeline:
        info = (
            pipeline
            | "Rows" >> beam.Create([*rows, *bad_rows])
            | beam_jobs.ConvertImages(
                rows_root=str(root),
                output_dir=str(tmp_path / "out"),
                image_config=ImageConfig(width=32, height=32),
                split_fractions={"train": 0.5, "validation": 0.5},
                max_bad_fraction=0.2,
            )
        )
        _ = info | beam.Map(lambda i: None)
    written = json.loads((tmp_path / "out" / "dataset_info.json").read_text())
    assert sum(s["num_examples"] for s in written["splits"].values()) == len(good)
    assert written["num_dead_letters"] == len(bad_rows)
    assert written["dead_letters_by_reason"] == {"bad_label": 1, "bad_manifest_row": 3}
    assert sorted(written["label_names"]) == sorted({pathlib.Path(p).parent.name for p in good})
    # The same rows written as an input list make the same shards: one set of rules for both.
    listing = tmp_path / "list.csv"
    listing.write_text("uri,label\n" + "".join(f"{root / r['uri']},{r['label']}\n" for r in rows))
    run_cli(
        "--manifest",
        listing,
        "--output_dir",
        tmp_path / "cli",
        "--image_size",
        "32",
        "--splits",
        "train=0.5,validation=0.5",
        "--allow_outside_root",
        "--direct_num_workers",
        "2",
    )
    cli_info = json.loads((tmp_path / "cli" / "dataset_info.json").read_text())
    assert {s: v["num_examples"] for s, v in cli_info["splits"].items()} == {
        s: v["num_examples"] for s, v in written["splits"].items()
    }
    # ConvertImages(spec): the same rows through a spec whose source is the rows' root.
    spec = beam_jobs.ConversionSpec(
        source=beam_jobs.Source(rows_root=str(root)),
        output_dir=str(tmp_path / "spec"),
        image=ImageConfig(width=32, height=32),
        splits=beam_jobs.SplitSpec(fractions={"train": 0.5, "validation": 0.5}),
        limits=beam_jobs.Limits(max_bad_fraction=0.2),
    )
    with beam.Pipeline(runner=fn_api_runner.FnApiRunner()) as pipeline:
        _ = pipeline | "Rows" >> beam.Create([*rows, *bad_rows]) | beam_jobs.ConvertImages(spec)
    assert _shard_bytes(tmp_path / "spec") == _shard_bytes(tmp_path / "out")
    # The spec's run mode means what it means for convert(): no overwrite, no replacing.
    with pytest.raises(beam_jobs.UsageError, match=r"already holds a dataset \(version 1"):
        beam_jobs.ConvertImages(spec)
    overwrite = spec.replace(mode=beam_jobs.RunMode(overwrite=True))
    with beam.Pipeline(runner=fn_api_runner.FnApiRunner()) as pipeline:
        _ = pipeline | "Rows" >> beam.Create(rows) | beam_jobs.ConvertImages(overwrite)
    replaced = tfdata_readers.load_manifest(tmp_path / "spec")
    assert (replaced.version, replaced["change"]["kind"], replaced["num_dead_letters"]) == (2, "overwrite", 0)
    # An append needs a dataset to append to, as on the command line.
    into_nothing = spec.replace(output_dir=str(tmp_path / "empty"), mode=beam_jobs.RunMode(append=True))
    with pytest.raises(beam_jobs.UsageError, match="no dataset to append to"):
        beam_jobs.ConvertImages(into_nothing)
    # A spec applied to the wrong kind of input says so, in the user's terms.
    with pytest.raises(TypeError, match="converts a PCollection of rows: apply it to one"):
        with beam.Pipeline(runner=fn_api_runner.FnApiRunner()) as pipeline:
            _ = pipeline | beam_jobs.ConvertImages(overwrite)
    tree = overwrite.replace(source=beam_jobs.Source(root=str(root)))
    with pytest.raises(TypeError, match="lists its own inputs: apply it to the pipeline"):
        with beam.Pipeline(runner=fn_api_runner.FnApiRunner()) as pipeline:
            _ = pipeline | beam.Create(rows) | beam_jobs.ConvertImages(tree)


def test_a_spec_of_relative_and_pathlib_paths_converts_and_is_unmoved_by_a_later_chdir(
    tmp_path, photo_tree, monkeypatch
):
    root, good, _ = photo_tree
    monkeypatch.chdir(root.parent)
    spec = beam_jobs.ConversionSpec(
        source=beam_jobs.Source(root=pathlib.Path(root.name)),
        output_dir=os.path.relpath(tmp_path / "new" / "out"),  # neither it nor its parent exists yet
        image=ImageConfig(width=16, height=16),
        limits=beam_jobs.Limits(max_bad_fraction=0.5),
        runner_args=("--direct_num_workers=1",),
    )
    assert (spec.source.root, spec.output_dir) == (str(root), str(tmp_path / "new" / "out"))
    monkeypatch.chdir(tmp_path)  # the paths were resolved when the spec was made
    info = beam_jobs.convert(spec=spec)
    assert info == tfdata_readers.load_manifest(tmp_path / "new" / "out")
    assert info.data_dir == str(tmp_path / "new" / "out")
    assert sum(split.num_examples for split in info.splits.values()) == len(good)
    # A mapping of the manifest's fields, hashable, with a repr that fits a notebook cell.
    assert list(info) == list(info.keys()) and len(info) == len(info.to_json())
    assert {info: 1}[tfdata_readers.load_manifest(tmp_path / "new" / "out")] == 1
    assert repr(info).startswith(f"DatasetInfo(data_dir={str(tmp_path / 'new' / 'out')!r}, version=1")
    assert len(repr(info)) < 400
    # The keyword form takes pathlib paths too.
    again = beam_jobs.convert(
        pathlib.Path(root),
        output_dir=tmp_path / "kw",
        image_size=16,
        max_bad_fraction=0.5,
        beam_options=["--direct_num_workers=1"],
    )
    assert _shard_bytes(tmp_path / "kw") == _shard_bytes(tmp_path / "new" / "out") and again.version == 1


def test_convert_images_takes_one_source():
    with pytest.raises(ValueError, match="exactly one of input_root"):
        beam_jobs.ConvertImages(output_dir="/tmp/x", input_root="/a", rows_root="/b")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_calling_process_alone_interrupts_convert_cleanly(tmp_path, photo_tree, signum):
    """As on the command line: the call raises KeyboardInterrupt within seconds, what the run wrote
    is gone, and the version before it is the current one, whole. The signal goes to the calling
    process only (not its workers' group), as a notebook's interrupt or a scheduler's stop does."""
    root = photo_tree[0]
    out = tmp_path / "out"
    run_cli("--input", root, "--output_dir", out, "--image_size", "32", "--max_bad_fraction", "0.5")
    committed = (out / "dataset_info.json").read_bytes()
    script = tmp_path / "call.py"
    script.write_text(
        "import sys\nimport beam_jobs\ntry:\n"
        f"    beam_jobs.convert({str(root)!r}, output_dir={str(out)!r}, image_size=48, overwrite=True,\n"
        "                      max_bad_fraction=0.5, isolation='all', beam_options={'direct_num_workers': 2})\n"
        "except KeyboardInterrupt as interrupt:\n    print('INTERRUPTED', interrupt, flush=True)\n    sys.exit(3)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list((out / "shards").iterdir())) < 2:  # the new run's folder: it has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        # At once: the whole run of 36 small images can take less than a second.
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3 and "INTERRUPTED" in stdout, stderr[-3000:]
    # The command line's one line, in keyword terms, as the exception's message.
    said = stdout.split("INTERRUPTED ", 1)[1]
    assert said.startswith("terminated (SIGTERM); " if signum == signal.SIGTERM else "interrupted; "), said
    assert "untouched" in said and "--" not in said, said
    assert (out / "dataset_info.json").read_bytes() == committed
    assert not (out / ".images-to-tfrecords.lock").exists()
    # Gone, but for the shards it completed, which stay staged for --resume (as on the command line;
    # a fast machine completes this small run's one shard before the signal), and the settings the
    # run recorded as it started, which a --resume over this dataset takes (run_folders.py).
    interrupted = [p for p in (out / "shards").iterdir() if p.name not in committed.decode("utf-8")]
    assert len(interrupted) <= 1, sorted(p.name for p in (out / "shards").rglob("*"))
    for folder in interrupted:
        names = sorted(p.name for p in folder.iterdir() if p.name != ".run.json")
        shards = [n for n in names if n.endswith(".tfrecord") and not n.startswith(".")]
        assert names == sorted([*shards, *(f".{n}.json" for n in shards)]), names
        assert shards or (folder / ".run.json").is_file(), names


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("pass --overwrite to replace it", "pass overwrite=True to replace it"),
        ("rerun with --overwrite --resume (and the same flags)", "rerun with overwrite=True resume=True (and the same"),
        ("more than --max_bad_fraction=0.01 (2 unreadable)", "more than max_bad_fraction=0.01 (2 unreadable)"),
        ("--output_dir /data/out already holds", "output_dir /data/out already holds"),
        ("raise --max_bad_fraction to accept them", "raise max_bad_fraction to accept them"),
        ("a path /data/x--overwrite stays", "a path /data/x--overwrite stays"),
        ("1 of 1 inputs failed [while running 'ConvertImages/WriteManifest']", "1 of 1 inputs failed"),
        ("--no_such_flag stays as written", "--no_such_flag stays as written"),
        ("Pass --changed_sources keep to keep them", "Pass changed_sources='keep' to keep them"),
        ("with --overwrite and the same flags", "with overwrite=True and the same flags"),
    ],
)
def test_an_error_message_names_the_keyword_where_the_command_line_names_the_flag(message, expected):
    assert expected in in_keyword_terms(message), in_keyword_terms(message)


@pytest.mark.slow
def test_convert_into_a_dataset_names_overwrite_true_not_the_flag(tmp_path, photo_tree):
    root = photo_tree[0]
    beam_jobs.convert(str(root), output_dir=str(tmp_path / "out"), image_size=32, max_bad_fraction=1.0)
    with pytest.raises(beam_jobs.UsageError) as refused:
        beam_jobs.convert(str(root), output_dir=str(tmp_path / "out"), image_size=32, max_bad_fraction=1.0)
    assert "overwrite=True" in str(refused.value) and "--overwrite" not in str(refused.value), refused.value


@pytest.mark.slow
def test_too_many_bad_inputs_through_convert_names_the_max_bad_fraction_keyword(tmp_path, photo_tree):
    root = photo_tree[0]  # 7 of its 43 files are not usable images: more than the default 0.01
    with pytest.raises(Exception) as refused:
        beam_jobs.convert(str(root), output_dir=str(tmp_path / "out"), image_size=32)
    assert "accept them by rerunning with max_bad_fraction=0.17" in str(refused.value), refused.value
    assert "--max_bad_fraction" not in str(refused.value), refused.value


def test_a_job_error_a_runner_wrapped_reaches_the_caller_as_itself_in_keyword_terms():
    """A runner re-raises a worker's SourceChangesError as a RuntimeError whose text holds the
    worker's trace; convert()'s caller gets the job's own error, one line, naming keywords."""
    from beam_jobs.api import _errors_in_keyword_terms
    from beam_jobs.writing.append import SourceChangesError

    wrapped = RuntimeError(
        'Traceback (most recent call last):\n  File "apache_beam/runners/common.py", line 1, in process\n'
        "beam_jobs.writing.append.SourceChangesError: --append: 1 input of version 1 changed (a/b.jpg); "
        "nothing was converted. Pass --changed_sources keep to keep their examples "
        "[while running 'ConvertImages/CheckSourceChanges']"
    )
    with pytest.raises(SourceChangesError) as raised, _errors_in_keyword_terms():
        raise wrapped
    message = str(raised.value)
    assert message.startswith("append=True: 1 input of version 1 changed (a/b.jpg)"), message
    assert "changed_sources='keep'" in message and "Traceback" not in message and "[while running" not in message
    assert raised.value.__cause__ is wrapped

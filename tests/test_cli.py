"""The command line answers --help and a misspelt flag without importing Beam or TensorFlow."""

from __future__ import annotations

import subprocess
import sys

import pytest

from beam_jobs.command_line import cli
from beam_jobs.command_line.arguments import UsageError, parse_job_arguments
from beam_jobs.command_line.beam_flags import BEAM_OPTION_STRINGS, BEAM_VERSION, live_beam_option_strings

_HEAVY = ("apache_beam", "tensorflow")


def _run_cli_in_fresh_python(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    code = (
        "import sys\nfrom beam_jobs.command_line import cli\n"
        "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as e:\n"
        f"    print('IMPORTED', [m for m in {_HEAVY!r} if m in sys.modules], file=sys.stderr)\n    raise\n"
    )
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    imported_line = [line for line in result.stderr.splitlines() if line.startswith("IMPORTED")]
    assert imported_line, result.stderr
    return result, set(eval(imported_line[0].split(" ", 1)[1]))  # noqa: S307 (our own list literal)


def test_help_groups_the_jobs_flags_with_examples_and_imports_neither_beam_nor_tensorflow():
    result, imported = _run_cli_in_fresh_python("--help")
    assert result.returncode == 0 and not imported
    text = result.stdout
    groups = [line for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert groups == [
        "options:",
        "inputs:",
        "output:",
        "annotations:",
        "image:",
        "splits:",
        "robustness:",
        "runs:",
        "runner:",
        "examples:",
    ]
    assert "--streaming" not in text and "--auto_unique_labels" not in text  # Beam's generic flags
    assert text.index("--input") < text.index("--runner") < text.index("examples:")


def test_version_answers_before_beam_is_imported():
    from beam_jobs import __version__  # pylint: disable=import-outside-toplevel

    result, imported = _run_cli_in_fresh_python("--input", "photos", "--version")
    assert (result.returncode, result.stdout, imported) == (0, f"images-to-tfrecords {__version__}\n", set())


def test_a_misspelt_flag_is_refused_before_beam_is_imported_with_the_same_message(tmp_path):
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "out"), "--imgae_size", "64"]
    result, imported = _run_cli_in_fresh_python(*argv)
    assert result.returncode == 2 and not imported
    with pytest.raises(UsageError) as full:
        parse_job_arguments(argv)
    assert result.stderr.splitlines()[0] == f"images-to-tfrecords: error: {full.value}"
    assert "did you mean --image_size?" in result.stderr


@pytest.mark.parametrize("typo", ["--image-size=64", "--outptu_dir", "--directnumworkers=2", "--runnr", "--x"])
def test_the_fast_check_says_what_the_full_parse_says(tmp_path, typo):
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), typo]
    with pytest.raises(UsageError) as full:
        parse_job_arguments(argv)
    assert cli.misspelt_flag(argv) == str(full.value)


def test_beams_own_flags_pass_the_fast_check(tmp_path):
    argv = [
        "--input",
        str(tmp_path),
        "--output_dir",
        str(tmp_path),
        "--direct_num_workers=1",
        "--runner",
        "DirectRunner",
        "--no_pipeline_type_check",
        "-v",
    ]
    assert cli.misspelt_flag(argv) is None
    parse_job_arguments(argv)


def test_with_another_beam_release_the_full_parse_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_installed_beam_version", lambda: "9.99.0")
    assert cli.misspelt_flag(["--input", str(tmp_path), "--flag_of_a_newer_beam"]) is None


def test_the_listed_beam_flags_are_the_installed_beams():
    """For the release they were copied from, the listed flags are exactly Beam's; under any other
    release (setup.py allows a range) the fast check stands aside and Beam's parser decides."""
    live = live_beam_option_strings()
    if cli._installed_beam_version() != BEAM_VERSION:  # pylint: disable=protected-access
        assert cli.misspelt_flag(["--a_flag_no_release_has"]) is None
        return
    assert BEAM_OPTION_STRINGS == live, (
        f"beam_flags.py is out of date: missing {sorted(live - BEAM_OPTION_STRINGS)}, "
        f"extra {sorted(BEAM_OPTION_STRINGS - live)}; python -m beam_jobs.command_line.beam_flags prints the new set"
    )


@pytest.mark.parametrize("workers", ["-1", "-8"])
def test_a_negative_worker_count_is_refused_by_the_parse_with_its_value(tmp_path, workers):
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "out"), "--direct_num_workers", workers]
    with pytest.raises(UsageError, match=rf"--direct_num_workers must be 0 \(all cores\) or more \(got {workers}\)"):
        parse_job_arguments(argv)


@pytest.mark.parametrize(
    "runner_flags",
    [
        ["--runner=FlinkRunner", "--max_bundle_size", "1000", "--object_reuse"],
        ["--runner", "flink", "--checkpointing_interval=60000"],
        ["--runner=SparkRunner", "--storage_level=DISK_ONLY"],
        ["--runner", "apache_beam.runners.portability.flink_runner.FlinkRunner", "--faster_copy"],
    ],
)
def test_a_job_servers_own_options_pass_with_its_runner(tmp_path, runner_flags):
    """Beam's portable runner takes the Java runner's options its job server describes (Beam's own
    pipelines are given them the same way): both checks let them through, and they reach Beam's
    options for the runner to parse at submission."""
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), *runner_flags]
    assert cli.misspelt_flag(argv) is None
    spec, _ = parse_job_arguments(argv)
    assert spec.runner_args == tuple(runner_flags)


@pytest.mark.parametrize(
    ("runner_flags", "says"),
    [
        (["--max_bundle_size=1000"], "--max_bundle_size is an option of FlinkRunner"),
        (["--runner=SparkRunner", "--max_bundle_size", "9"], "it applies with --runner FlinkRunner"),
        (["--runner=FlinkRunner", "--storage_level=DISK_ONLY"], "--storage_level is an option of SparkRunner"),
        (["--object_reuse"], "(launch/submit_flink.sh)"),
        (["--runner=FlinkRunner", "--max_bundel_size=9"], "did you mean --max_bundle_size?"),
    ],
)
def test_a_job_servers_option_with_another_runner_is_refused_naming_its_runner(tmp_path, runner_flags, says):
    """The local runner has no job server: Flink's --max_bundle_size there would be dropped by
    Beam with a warning, so it is refused, both checks alike, saying which runner takes it."""
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), *runner_flags]
    with pytest.raises(UsageError) as full:
        parse_job_arguments(argv)
    assert says in str(full.value)
    assert cli.misspelt_flag(argv) == str(full.value)


@pytest.mark.parametrize("runner", ["--runner=FlinkRunner", "--runner=SparkRunner", "--runner=DirectRunner"])
def test_load_balance_bundles_is_refused_saying_why(tmp_path, runner):
    """Beam's --load_balance_bundles hung this job on a Flink cluster: refused with the reason,
    whichever runner is named, rather than let through to a job that never ends."""
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), runner, "--load_balance_bundles"]
    with pytest.raises(UsageError) as full:
        parse_job_arguments(argv)
    assert "--load_balance_bundles is refused: it hung this job on Flink" in str(full.value)
    assert cli.misspelt_flag(argv) == str(full.value)


def test_beam_does_not_warn_about_the_runner_options_it_is_given(tmp_path, caplog):
    """Beam's PipelineOptions warns "Unparseable argument" for a job server's options (it learns
    of them at submission): for those the checks let through, nothing is said. A value no other
    test gives: Beam says each message once per process."""
    size = str(100_000 + len(str(tmp_path)))
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), "--runner=FlinkRunner"]
    with caplog.at_level("WARNING"):
        _, options = parse_job_arguments([*argv, "--max_bundle_size", size, f"--checkpointing_interval={size}"])
        options.get_all_options(display_warnings=True)  # as beam.Pipeline() asks for them
        options.get_all_options()  # as a view of them does
    assert not [r.getMessage() for r in caplog.records if "nparseable" in r.getMessage()]


@pytest.mark.parametrize(
    ("runner_flags", "says"),
    [
        # Beam drops a switch's value without a word: "false" would turn object reuse on.
        (["--object_reuse", "false"], "--object_reuse is a switch that takes no value: giving it turns it on"),
        (["--object_reuse=false"], "--object_reuse is a switch that takes no value"),
        # Beam adds a switch that is on by default as "store_false": "true" would turn chaining off.
        (["--operator_chaining", "true"], "giving it turns off what is on by default"),
        (["--max_bundle_size", "notanumber"], "--max_bundle_size takes a whole number (got 'notanumber')"),
        (["--max_bundle_size"], "--max_bundle_size needs a value"),
        (["--max_bundle_size", "--object_reuse"], "--max_bundle_size needs a value"),
        (["--max_bundle_size=5", "--max_bundle_size=6"], "--max_bundle_size is given more than once"),
    ],
)
def test_a_runner_option_beam_would_misread_is_refused_before_anything_runs(tmp_path, runner_flags, says):
    """Beam parses a job server's options only at submission: a bad value then ends the run with
    Beam's whole usage text, and a switch's value is dropped silently, so these are refused first,
    in one line, by both checks alike."""
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), "--runner=FlinkRunner", *runner_flags]
    with pytest.raises(UsageError) as full:
        parse_job_arguments(argv)
    assert says in str(full.value)
    assert cli.misspelt_flag(argv) == str(full.value)


def test_portable_runner_takes_either_job_servers_options(tmp_path):
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), "--runner", "PortableRunner"]
    argv += ["--job_endpoint", "localhost:1", "--max_bundle_size", "1000", "--storage_level=DISK_ONLY"]
    assert cli.misspelt_flag(argv) is None
    parse_job_arguments(argv)


@pytest.mark.parametrize("runners", [["--runner", "FlinkRunner", "--runner", "DirectRunner"], ["--runner="]])
def test_a_second_or_blank_runner_is_what_is_refused(tmp_path, runners):
    """Which runner's options are taken depends on --runner: given twice or blank, that is the
    error, not a runner option's."""
    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "o"), *runners, "--max_bundle_size", "9"]
    assert cli.misspelt_flag(argv) is None
    with pytest.raises(UsageError, match="--runner (is given more than once|needs a value)"):
        parse_job_arguments(argv)


def test_the_python_call_gives_a_runner_switch_as_the_command_line_does(tmp_path):
    """convert()'s beam_options as a mapping: a switch that is on by default (operator_chaining)
    is turned off by False, which the command line writes as the switch given."""
    from beam_jobs.api import _runner_args  # pylint: disable=import-outside-toplevel

    given = {"object_reuse": True, "operator_chaining": False, "fail_on_checkpointing_errors": True}
    assert _runner_args("FlinkRunner", given, own=set()) == (
        "--runner=FlinkRunner",
        "--object_reuse",
        "--operator_chaining",
    )
    with pytest.raises(UsageError, match="the runner is given twice"):
        _runner_args("DirectRunner", ["--runner=FlinkRunner"], own=set())
    with pytest.raises(UsageError, match="the runner is given twice, in beam_options"):
        _runner_args(None, ["--runner=FlinkRunner", "--runner", "DirectRunner"], own=set())

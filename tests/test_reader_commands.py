"""The reader's commands answer a misspelt flag by its name, even where a required argument is missing too."""

from __future__ import annotations

import pytest

from tfdata_readers.checking import verify_cli
from tfdata_readers.inspect import main as inspect_main


def _error(capsys, main, args: list[str]) -> tuple[object, str]:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "main, args, message",
    [
        # The required DATA_DIR and --out are missing too: the typo is what the user needs to hear.
        (
            verify_cli.main,
            ["--tpyo"],
            "verify-tfrecords: error: unrecognized argument --tpyo; see verify-tfrecords --help",
        ),
        (
            verify_cli.main,
            ["--splitt", "train"],
            "verify-tfrecords: error: unrecognized argument --splitt; did you mean --split?",
        ),
        (
            inspect_main,
            ["data", "--outt", "r"],
            "inspect-tfrecords: error: unrecognized argument --outt; did you mean --out?",
        ),
        (
            inspect_main,
            ["--out=r", "--seeed=3"],
            "inspect-tfrecords: error: unrecognized argument --seeed; did you mean --seed?",
        ),
    ],
)
def test_a_misspelt_flag_is_named_before_a_missing_argument(capsys, main, args, message):
    assert _error(capsys, main, args) == (2, message + "\n")


@pytest.mark.parametrize(
    "main, args, message",
    [
        (verify_cli.main, [], "verify-tfrecords: error: the following arguments are required: data_dir"),
        (
            verify_cli.main,
            ["data", "--version", "-1"],
            "verify-tfrecords: error: argument --version: must be an integer >= 1 (got '-1')",
        ),
        (inspect_main, ["data"], "inspect-tfrecords: error: the following arguments are required: --out"),
    ],
)
def test_a_missing_argument_or_a_negative_value_is_still_argparses_own_error(capsys, main, args, message):
    assert _error(capsys, main, args) == (2, message + "\n")

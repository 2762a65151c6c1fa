"""A run's settings record (shards/<run>/.run.json) and the settings a continuing run takes from
the folder: each case from a hostile review of the record and of grey from the luma plane."""

from __future__ import annotations

import json
import logging

import pytest

from beam_jobs.preflight import with_dataset_defaults
from beam_jobs.run import _undo
from beam_jobs.run_context import RunContext
from beam_jobs.writing.commit import Current
from beam_jobs.writing.run_folders import new_run_name

RECORD = ".run.json"


def _spec(tmp_path, **keywords):
    from beam_jobs.api import spec_from_keywords  # pylint: disable=import-outside-toplevel

    (tmp_path / "photos" / "a").mkdir(parents=True, exist_ok=True)
    arguments = {"input": str(tmp_path / "photos"), "output_dir": str(tmp_path / "out"), **keywords}
    return spec_from_keywords(arguments)[0]


def _dataset(tmp_path, **preprocessing) -> None:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    manifest = {"version": 1, "fingerprint": "0" * 32, "preprocessing": {"image_size": "24x24", **preprocessing}}
    (out / "dataset_info.json").write_text(json.dumps(manifest))


def _killed_run(tmp_path, record: bytes | None):
    run = tmp_path / "out" / "shards" / new_run_name()
    run.mkdir(parents=True)
    if record is not None:
        (run / RECORD).write_bytes(record)
    return run


@pytest.mark.parametrize(
    ("made", "keywords", "grey_decode"),
    [
        ({"channels": 1, "resample": "dct_sinc"}, {"append": True}, "pillow"),  # grey, made before the luma plane
        ({"channels": 1, "resample": "dct_sinc", "grey_decode": "luma"}, {"append": True}, None),  # made since
        # A colour dataset, or a grey one with a Pillow resampling, never had a luma plane to take:
        # made again in grey with an array resampling, it is a new grey dataset.
        ({"channels": 3, "resample": "dct_sinc"}, {"overwrite": True, "resume": True}, None),
        ({"channels": 1, "resample": "bicubic"}, {"overwrite": True, "resume": True, "resample": "dct_sinc"}, None),
    ],
)
def test_only_a_grey_dataset_made_before_the_luma_plane_keeps_pillows_grey(tmp_path, made, keywords, grey_decode):
    _dataset(tmp_path, **made)
    spec = with_dataset_defaults(_spec(tmp_path, channels=1, **keywords))
    assert spec.image.grey_decode == grey_decode
    assert spec.image.to_json().get("grey_decode") == (None if grey_decode == "pillow" else "luma")


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b'{"preprocessing": {',
        b"[1, 2]",
        b'{"preprocessing": "dct_sinc"}',
        b'{"preprocessing": {}}',
        b'{"preprocessing": {"resample": "nonsense"}}',
        b'{"preprocessing": {"resample": 5}}',
        b'{"preprocessing": {"resample": null}}',
        b'{"preprocessing": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["empty", "cut", "list", "string", "no resample", "unknown", "number", "null", "deep"],
)
def test_a_damaged_record_never_chooses_the_settings_and_is_named(tmp_path, caplog, record):
    """It was skipped without a word (and `{}` meant the first release's bicubic), a value that
    parsed but named no method failed the run far from its cause, and a deep one was a RecursionError."""
    _dataset(tmp_path, channels=3, resample="dct_bicubic")
    run = _killed_run(tmp_path, record)
    with caplog.at_level(logging.WARNING, logger="beam_jobs"):
        spec = with_dataset_defaults(_spec(tmp_path, overwrite=True, resume=True))
    assert spec.image.resample == "dct_bicubic"  # the version's, as without a record
    assert f"ignoring the settings record {run / RECORD}" in caplog.text


@pytest.mark.parametrize("interrupted", [True, False])
def test_an_interrupt_over_a_dataset_keeps_the_record_and_a_failure_does_not(tmp_path, interrupted):
    """Ctrl-C or SIGTERM before the first shard deleted the record, so a --resume then took the
    version's resampling where a SIGKILL at the same moment kept the run's own: over a dataset,
    an interrupt keeps it now. A failure (nothing to resume) and an interrupt in a folder that
    holds no dataset leave nothing."""
    _dataset(tmp_path, channels=3, resample="dct_bicubic")
    spec = _spec(tmp_path, overwrite=True)
    run = _killed_run(tmp_path, json.dumps({"preprocessing": {"resample": "dct_sinc"}}).encode())
    error = KeyboardInterrupt() if interrupted else RuntimeError("a step failed")
    version = json.loads((tmp_path / "out" / "dataset_info.json").read_text())
    _undo(error, spec, RunContext(run_id=run.name, expected=Current(version, None, None)), None, [], frozenset())
    assert (run / RECORD).exists() == interrupted
    if interrupted:
        assert with_dataset_defaults(_spec(tmp_path, overwrite=True, resume=True)).image.resample == "dct_sinc"
    new = tmp_path / "new"
    (new / "out").mkdir(parents=True)
    run = _killed_run(new, json.dumps({"preprocessing": {"resample": "dct_sinc"}}).encode())
    _undo(
        KeyboardInterrupt(),
        _spec(new),
        RunContext(run_id=run.name, expected=Current(None, None, None)),
        None,
        [],
        frozenset(),
    )
    assert not (new / "out" / "shards").exists()

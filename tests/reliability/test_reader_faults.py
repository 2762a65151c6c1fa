"""Reader faults: flipped bytes, shards cut at a record boundary, missing or unknown shards, newer or wrong schemas."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

_READERS = pathlib.Path(__file__).resolve().parents[1] / "readers"
if str(_READERS) not in sys.path:
    sys.path.insert(0, str(_READERS))

import reader_fixtures  # noqa: E402
import shard_faults  # noqa: E402

import tfdata_readers  # noqa: E402
from tfdata_readers.checking import verify_cli  # noqa: E402

_REPO = pathlib.Path(__file__).resolve().parents[2]
_ENV = {**os.environ, "PYTHONPATH": str(_REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
SHARD = "train-00001-of-00003.tfrecord"  # 8 of the 24 training examples


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory) -> pathlib.Path:
    """train: 24 examples in 3 shards of 8; validation: 7 examples in 1 shard."""
    return reader_fixtures.write_dataset(
        tmp_path_factory.mktemp("faults") / "data",
        splits={"train": (24, 3), "validation": (7, 1)},
        image_size=(16, 16),
        seed=21,
    )


@pytest.fixture
def data_dir(clean_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(clean_dir, tmp_path / "data"))


def _keys(dataset: tf.data.Dataset) -> list[str]:
    return [k.decode() for _, _, meta in dataset for k in meta["key"].numpy()]


def _verify_cli(data_dir: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=120,
    )


def _tf_reads_without_error(path: pathlib.Path) -> int:
    """Records TensorFlow's own reader returns; raises if it reports an error."""
    return sum(1 for _ in tf.data.TFRecordDataset(str(path)))


# One flipped byte in a record's length or data.


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("part", ["length", "data"])
def test_flipped_byte_fails_naming_shard_and_offset(data_dir: pathlib.Path, part: str, training: bool) -> None:
    offset = shard_faults.flip_record_byte(data_dir / SHARD, 3, part)
    # TensorFlow reports the offset of the part whose CRC failed: the record's, or its data's.
    tf_offset = offset if part == "length" else offset + shard_faults.HEADER_BYTES
    ds = tfdata_readers.make_dataset(data_dir, "train", 4, training=training, seed=0, with_metadata=True)
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        _keys(ds)
    message = failure.value.message
    assert re.search(
        rf"corrupt or truncated shard \S*/{re.escape(SHARD)}: first unreadable record at byte offset {offset} "
        rf"\(record 3\) - read 3 of 8 records the manifest lists; TensorFlow: corrupted record at {tf_offset}",
        message,
    ), message


@pytest.mark.parametrize("part", ["length", "data"])
def test_skip_corrupt_reports_the_records_lost(data_dir: pathlib.Path, part: str, capfd) -> None:
    expected = reader_fixtures.expected_keys(data_dir, "train")
    lost_keys = set(reader_fixtures.expected_keys(data_dir, "train")[8 + 3 : 16])  # records 3-7 of shard 1
    offset = shard_faults.flip_record_byte(data_dir / SHARD, 3, part)
    tfdata_readers.reset_skipped_records()
    keys = _keys(tfdata_readers.make_dataset(data_dir, "train", 4, with_metadata=True, skip_corrupt=True))
    assert sorted(keys) == sorted(k for k in expected if k not in lost_keys)
    assert tfdata_readers.skipped_records() == {str(data_dir / SHARD): 5}
    err = capfd.readouterr().err
    assert "skipped 5 corrupt or unreadable record(s)" in err and f"from byte offset {offset}" in err, err


# A shard cut exactly at a record boundary reads "cleanly" in TensorFlow.


def _cut_at_boundary(data_dir: pathlib.Path, keep: int) -> int:
    """Cuts SHARD after `keep` records; returns the new size."""
    size = shard_faults.record_offsets(data_dir / SHARD)[keep][0]
    shard_faults.truncate(data_dir / SHARD, size)
    assert _tf_reads_without_error(data_dir / SHARD) == keep  # the premise: no error from TensorFlow
    return size


def test_cut_at_record_boundary_fails_at_start_up(data_dir: pathlib.Path) -> None:
    full = (data_dir / SHARD).stat().st_size
    size = _cut_at_boundary(data_dir, 5)
    for training in (False, True):
        with pytest.raises(
            tfdata_readers.ShardError, match=rf"{re.escape(SHARD)} has {size} bytes; the manifest says {full}"
        ):
            tfdata_readers.make_dataset(data_dir, "train", 4, training=training, seed=0)


@pytest.mark.slow
def test_cut_at_record_boundary_is_reported_by_verify(data_dir: pathlib.Path) -> None:
    full = (data_dir / SHARD).stat().st_size
    size = _cut_at_boundary(data_dir, 5)
    problems = sorted(str(p) for p in tfdata_readers.verify(data_dir))
    path = str(data_dir / SHARD)
    assert len(problems) == 3, problems
    assert f"{path}: {size} bytes, manifest says {full}" in problems
    assert f"{path}: 5 records, manifest says 8" in problems
    assert any(p.startswith(f"{path}: sha256 ") for p in problems)
    cli = _verify_cli(data_dir, "--split", "train")
    assert cli.returncode == 1
    assert f"MISMATCH {path}: 5 records, manifest says 8" in cli.stderr
    assert "checked 3 shard(s) of split(s) train: 3 problem(s)" in cli.stdout


def test_cut_at_record_boundary_with_a_matching_size_fails_on_the_count(data_dir: pathlib.Path) -> None:
    """Even when the manifest's bytes and sha256 agree with the cut file, its count catches the cut."""
    size = _cut_at_boundary(data_dir, 5)
    shard_faults.refresh_shard_entry(data_dir, SHARD)
    ds = tfdata_readers.make_dataset(data_dir, "train", 4, with_metadata=True)  # start-up passes now
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"{re.escape(SHARD)}: first unreadable record at byte offset {size} \(record 5\) - read 5 of 8 "
        rf"records the manifest lists; TensorFlow reads it without error",
    ):
        _keys(ds)
    assert [str(p) for p in tfdata_readers.verify(data_dir)] == [f"{data_dir / SHARD}: 5 records, manifest says 8"]


# Missing shard, unknown extra shard, newer schema_version: start-up errors naming the file or version.


def _remove_shard(data_dir: pathlib.Path) -> str:
    (data_dir / SHARD).unlink()
    return rf"{re.escape(SHARD)} is listed in the manifest but does not exist"


def _add_unknown_shard(data_dir: pathlib.Path) -> str:
    shutil.copy(data_dir / "train-00000-of-00003.tfrecord", data_dir / "train-00003-of-00003.tfrecord")
    return (
        r"train-00003-of-00003\.tfrecord look\(s\) like shard\(s\) of split 'train' "
        r"but .*dataset_info\.json does not list"
    )


def _add_stale_shard(data_dir: pathlib.Path) -> str:
    shutil.copy(data_dir / SHARD, data_dir / "train-00004-of-00006.tfrecord")  # from an earlier run with 6 shards
    return r"train-00004-of-00006\.tfrecord look\(s\) like shard\(s\) of split 'train'"


def _newer_schema(data_dir: pathlib.Path) -> str:
    shard_faults.edit_manifest(data_dir, lambda m: m.update(schema_version=3))
    return r"dataset_info\.json has schema_version 3; this reader knows versions up to 2"


@pytest.mark.parametrize(
    "fault, error, cli_line",
    [
        (_remove_shard, tfdata_readers.ShardError, rf"MISMATCH \S*{re.escape(SHARD)}: missing"),
        (
            _add_unknown_shard,
            tfdata_readers.ShardError,
            r"MISMATCH \S*train-00003-of-00003\.tfrecord: named like a shard but not listed in dataset_info\.json",
        ),
        (
            _add_stale_shard,
            tfdata_readers.ShardError,
            r"MISMATCH \S*train-00004-of-00006\.tfrecord: named like a shard but not listed",
        ),
        (_newer_schema, ValueError, r"ERROR \S*dataset_info\.json has schema_version 3"),
    ],
    ids=["missing", "unknown", "stale", "newer-schema"],
)
def test_start_up_fault_names_the_file(data_dir: pathlib.Path, fault, error: type, cli_line: str, capsys) -> None:
    pattern = fault(data_dir)
    for training in (False, True):
        with pytest.raises(error, match=pattern):
            tfdata_readers.make_dataset(data_dir, "train", 4, training=training, seed=0)
    # The CLI's main() in-process; test_cut_at_record_boundary_is_reported_by_verify runs the real command.
    assert verify_cli.main([str(data_dir)]) == 1
    err = capsys.readouterr().err
    assert re.search(cli_line, err), err


def test_only_final_shard_names_of_the_split_are_checked(data_dir: pathlib.Path) -> None:
    """The writer's hidden staged and temp files are not shards; another split's stray file only fails verify."""
    shutil.copy(data_dir / SHARD, data_dir / f".staged-{SHARD}")
    shutil.copy(data_dir / SHARD, data_dir / f".tmp-0123abcd-{SHARD}")
    assert len(_keys(tfdata_readers.make_dataset(data_dir, "train", 8, with_metadata=True))) == 24
    assert tfdata_readers.verify(data_dir) == []
    shutil.copy(data_dir / SHARD, data_dir / "test-00000-of-00001.tfrecord")
    assert len(_keys(tfdata_readers.make_dataset(data_dir, "train", 8, with_metadata=True))) == 24
    assert [str(p) for p in tfdata_readers.verify(data_dir)] == [
        f"{data_dir / 'test-00000-of-00001.tfrecord'}: named like a shard but not listed in dataset_info.json"
    ]
    assert tfdata_readers.verify(data_dir, ["train"]) == []


# Schema mismatches: in the manifest (at start-up), and in a record (while reading).


@pytest.mark.parametrize(
    "key, declared, with_metadata, pattern",
    [
        (
            "image/class/label",
            None,
            False,
            r"does not declare feature 'image/class/label', which this reader needs as 'int64'",
        ),
        (
            "image/class/label",
            {"dtype": "string", "shape": []},
            False,
            r"declares feature 'image/class/label' as dtype 'string'; this reader expects 'int64'",
        ),
        (
            "image/encoded",
            {"dtype": "int64", "shape": []},
            False,
            r"declares feature 'image/encoded' as dtype 'int64'; this reader expects 'string'",
        ),
        (
            "image/key/sha256",
            {"dtype": "float32", "shape": []},
            True,
            r"declares feature 'image/key/sha256' as dtype 'float32'; this reader expects 'string'",
        ),
        (
            "image/class/label",
            {"dtype": "int64", "shape": [2]},
            False,
            r"declares feature 'image/class/label' with shape \[2\]; expected \[\]",
        ),
    ],
    ids=["label-missing", "label-as-string", "encoded-as-int64", "key-as-float32", "label-shape"],
)
def test_manifest_schema_mismatch_fails_at_start_up(
    data_dir: pathlib.Path, key: str, declared: dict | None, with_metadata: bool, pattern: str
) -> None:
    def edit(manifest: dict) -> None:
        if declared is None:
            del manifest["features"][key]
        else:
            manifest["features"][key] = declared

    shard_faults.edit_manifest(data_dir, edit)
    with pytest.raises(ValueError, match=rf"dataset_info\.json {pattern}"):
        tfdata_readers.make_dataset(data_dir, "train", 4, with_metadata=with_metadata)
    problems = [str(p) for p in tfdata_readers.verify(data_dir)]
    assert len(problems) == 1 and re.search(rf"dataset_info\.json: {pattern}", problems[0]), problems


def _drop_label(example: tf.train.Example) -> None:
    del example.features.feature["image/class/label"]


def _label_as_bytes(example: tf.train.Example) -> None:
    example.features.feature["image/class/label"].bytes_list.value[:] = [b"3"]


def _encoded_as_int(example: tf.train.Example) -> None:
    example.features.feature["image/encoded"].int64_list.value[:] = [7]


def _two_labels(example: tf.train.Example) -> None:
    example.features.feature["image/class/label"].int64_list.value.append(1)


@pytest.mark.parametrize(
    "edit, tf_error, problem",
    [
        (
            _drop_label,
            r"Feature: image/class/label \(data type: int64\) is required but could not be found",
            "lacks feature image/class/label (int64)",
        ),
        (
            _label_as_bytes,
            r"Key: image/class/label, Index: \d+\.  Data types don't match\. Data type: string but "
            r"expected type: int64",
            "has feature image/class/label as string; expected int64",
        ),
        (
            _encoded_as_int,
            r"Key: image/encoded, Index: \d+\.  Data types don't match\. Data type: int64 but "
            r"expected type: string",
            "has feature image/encoded as int64; expected string",
        ),
        (
            _two_labels,
            r"Key: image/class/label, Index: \d+\.  Number of int64 values != expected",
            "has 2 values in feature image/class/label; expected 1 int64",
        ),
    ],
    ids=["missing-key", "label-as-bytes", "encoded-as-int", "two-labels"],
)
@pytest.mark.parametrize(
    "options", [{}, {"training": True, "seed": 0, "skip_corrupt": True}], ids=["eval", "train-skip"]
)
def test_bad_record_fails_naming_shard_record_and_key(
    data_dir: pathlib.Path, edit, tf_error: str, problem: str, options: dict
) -> None:
    """TensorFlow's own parse error, which names the key and the dtypes, also names the shard, record and offset."""
    shard_faults.rewrite_record(data_dir, SHARD, 4, edit)
    offset = shard_faults.record_offsets(data_dir / SHARD)[4][0]
    ds = tfdata_readers.make_dataset(data_dir, "train", 4, with_metadata=True, **options)  # start-up passes
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        _keys(ds)
    want = rf"Name: shard {re.escape(str(data_dir / SHARD))} record 4 at byte offset {offset}, {tf_error}"
    assert re.search(want, failure.value.message), failure.value.message
    assert [str(p) for p in tfdata_readers.verify(data_dir)] == [
        f"{data_dir / SHARD}: record 4 at byte offset {offset} {problem}"
    ]


def test_manifest_without_declared_features_is_refused(data_dir: pathlib.Path) -> None:
    """A manifest must declare the features it holds: an empty `features` fails at start-up naming
    the first key the reader needs, and a missing one names the field."""
    shard_faults.edit_manifest(data_dir, lambda m: m.update(features={}))
    with pytest.raises(ValueError, match=r"dataset_info\.json does not declare feature 'image/encoded'"):
        tfdata_readers.make_dataset(data_dir, "train", 8)
    shard_faults.edit_manifest(data_dir, lambda m: m.pop("features"))
    with pytest.raises(ValueError, match=r"dataset_info\.json: missing required field 'features'"):
        tfdata_readers.make_dataset(data_dir, "train", 8)


def test_skip_corrupt_counts_each_lost_record_once_across_input_pipelines(data_dir: pathlib.Path, capfd) -> None:
    """4 pipelines over 3 shards: the lost records of shard 1 belong to two pipelines' shares, and
    each pipeline reports only its own, so together they report exactly the 5 records lost."""
    expected = reader_fixtures.expected_keys(data_dir, "train")
    lost_keys = set(expected[8 + 3 : 16])  # records 3-7 of shard 1
    shard_faults.flip_record_byte(data_dir / SHARD, 3, "data")
    tfdata_readers.reset_skipped_records()
    keys = []
    for pipeline_id in range(4):
        context = tf.distribute.InputContext(
            num_input_pipelines=4, input_pipeline_id=pipeline_id, num_replicas_in_sync=4
        )
        keys += _keys(
            tfdata_readers.make_dataset(
                data_dir, "train", 2, input_context=context, with_metadata=True, skip_corrupt=True
            )
        )
    assert sorted(keys) == sorted(k for k in expected if k not in lost_keys)
    assert tfdata_readers.skipped_records() == {str(data_dir / SHARD): 5}
    err = capfd.readouterr().err
    # Shares of 6: pipeline 1 holds records 0-3 of shard 1 and loses 1; pipeline 2 holds 4-7 and loses 4.
    assert "skipped 1 corrupt or unreadable record(s)" in err and "skipped 4 corrupt or unreadable record(s)" in err, (
        err
    )


def test_verify_reports_a_missing_dead_letters_file(data_dir: pathlib.Path) -> None:
    (data_dir / "dead_letters.jsonl").unlink()
    path = data_dir / "dead_letters.jsonl"
    assert [str(p) for p in tfdata_readers.verify(data_dir)] == [
        f"{path}: missing; dataset_info.json names it and the format says it is always present"
    ]
    cli = _verify_cli(data_dir)
    assert cli.returncode == 1 and f"MISMATCH {path}: missing" in cli.stderr


def test_verify_reports_dead_letters_that_disagree_with_the_manifest(data_dir: pathlib.Path) -> None:
    path = data_dir / "dead_letters.jsonl"
    path.write_text('{"uri": "a.jpg", "stage": "decode", "reason": "truncated", "detail": ""}\nnot json\n')
    problems = [str(p) for p in tfdata_readers.verify(data_dir)]
    assert problems[0].startswith(f"{path}: line 2 is not JSON"), problems
    assert f"{path}: 2 dead letter(s), dataset_info.json says 0" in problems


# Manifest edits that would make the reader deliver wrong data while every shard is intact.


def _train_shard(manifest: dict, index: int = 0) -> dict:
    return manifest["splits"]["train"]["shards"][index]


def _in_two_splits(manifest: dict) -> None:
    """Train/validation leakage: validation lists a training shard."""
    manifest["splits"]["validation"]["shards"].append(dict(_train_shard(manifest)))
    manifest["splits"]["validation"]["num_examples"] += _train_shard(manifest)["num_examples"]
    manifest["splits"]["validation"]["num_shards"] += 1


def _listed_twice(manifest: dict) -> None:
    manifest["splits"]["train"]["shards"].append(dict(_train_shard(manifest)))
    manifest["splits"]["train"]["num_examples"] += _train_shard(manifest)["num_examples"]
    manifest["splits"]["train"]["num_shards"] += 1


def _leaves_the_data_dir(manifest: dict) -> None:
    _train_shard(manifest)["file"] = f"../data/{_train_shard(manifest)['file']}"


def _absolute_path(manifest: dict) -> None:
    _train_shard(manifest)["file"] = f"/tmp/{_train_shard(manifest)['file']}"


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (_in_two_splits, r"shard file 'train-00000-of-00003\.tfrecord' is listed in splits 'train' and 'validation'"),
        (_listed_twice, r"shard file 'train-00000-of-00003\.tfrecord' is listed twice in split 'train'"),
        (
            _leaves_the_data_dir,
            r"shard file '\.\./data/train-00000-of-00003\.tfrecord' is not a path inside the data dir",
        ),
        (_absolute_path, r"shard file '/tmp/train-00000-of-00003\.tfrecord' is not a path inside the data dir"),
        (lambda m: m.update(num_classes=3), r"num_classes is 3 but label_names holds 7 name\(s\)"),
        (
            lambda m: m["splits"]["train"].update(num_shards=5),
            r"split 'train' says num_shards 5 but lists 3 shard\(s\)",
        ),
    ],
    ids=["in-two-splits", "listed-twice", "dot-dot", "absolute", "num-classes", "num-shards"],
)
def test_structural_manifest_edits_are_refused_at_start_up_and_reported_by_verify(
    data_dir: pathlib.Path, edit, pattern: str
) -> None:
    shard_faults.edit_manifest(data_dir, edit)
    for split in ("train", "validation"):
        with pytest.raises(ValueError, match=rf"dataset_info\.json: .*{pattern}"):
            tfdata_readers.make_dataset(data_dir, split, 4, training=True, seed=0)
    with pytest.raises(ValueError, match=pattern):
        tfdata_readers.load_manifest(data_dir)
    cli = _verify_cli(data_dir)
    assert cli.returncode == 1 and re.search(rf"MISMATCH \S*dataset_info\.json: .*{pattern}", cli.stderr), cli.stderr


def _set_image(**values: object):
    return lambda manifest: manifest["image"].update(values)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (_set_image(height=64), "image/height 16, manifest image.height says 64"),
        (_set_image(width=8), "image/width 16, manifest image.width says 8"),
        (_set_image(channels=1), "image/channels 3, manifest image.channels says 1"),
        (_set_image(format="PNG"), "image/format 'JPEG', manifest image.format says 'PNG'"),
        (
            lambda m: m.update(label_names=[f"class{i}" for i in range(7)]),
            r"label \d is 'class\d' in label_names but the record's class text is '\w+'",
        ),
        (lambda m: m.update(label_names=m["label_names"][:2], num_classes=2), r"label \d, not in \[0, num_classes=2\)"),
    ],
    ids=["height", "width", "channels", "format", "label-names", "label-out-of-range"],
)
def test_verify_reports_records_that_disagree_with_the_manifest(data_dir: pathlib.Path, edit, problem: str) -> None:
    shard_faults.edit_manifest(data_dir, edit)
    problems = [str(p) for p in tfdata_readers.verify(data_dir)]
    for shard in ("train-00000-of-00003", "validation-00000-of-00001"):
        assert any(
            re.search(
                rf"{shard}\.tfrecord: record \d+ at byte offset \d+ disagrees with dataset_info\.json: {problem}", p
            )
            for p in problems
        ), problems
    assert _verify_cli(data_dir).returncode == 1


def test_verify_reports_dead_letter_fields_of_the_wrong_type(data_dir: pathlib.Path) -> None:
    path = data_dir / "dead_letters.jsonl"
    path.write_text('{"uri": 1, "stage": null, "reason": [], "detail": "d"}\n')
    shard_faults.edit_manifest(data_dir, lambda m: m.update(num_dead_letters=1))
    assert [str(p) for p in tfdata_readers.verify(data_dir)] == [
        f"{path}: line 1 has non-string field(s) {{'uri': 'int', 'stage': 'NoneType', 'reason': 'list'}}; "
        f"FORMAT.md says str"
    ]
    assert _verify_cli(data_dir).returncode == 1


# skip_corrupt: a loss is counted once per record, truncated shards are read, and under tf.distribute
# a pipeline that would come up short of batches fails instead of yielding fewer than the others.


def test_skip_corrupt_counts_a_record_lost_every_epoch_once(data_dir: pathlib.Path) -> None:
    shard_faults.flip_record_byte(data_dir / SHARD, 3, "data")
    tfdata_readers.reset_skipped_records()
    ds = tfdata_readers.make_dataset(data_dir, "train", 4, with_metadata=True, skip_corrupt=True, num_epochs=3)
    assert len(_keys(ds)) == 3 * (24 - 5)
    assert len(_keys(ds)) == 3 * (24 - 5)  # iterated again: still the same 5 records
    assert tfdata_readers.skipped_records() == {str(data_dir / SHARD): 5}


@pytest.mark.parametrize("cut", ["boundary", "mid-record"])
def test_skip_corrupt_reads_a_truncated_shard_and_counts_the_loss(data_dir: pathlib.Path, cut: str, caplog) -> None:
    """The start-up size check is a warning with skip_corrupt=True: records 5-7 of the shard are lost."""
    expected = reader_fixtures.expected_keys(data_dir, "train")
    offset, length = shard_faults.record_offsets(data_dir / SHARD)[5]
    full = (data_dir / SHARD).stat().st_size
    size = offset if cut == "boundary" else offset + length // 2
    shard_faults.truncate(data_dir / SHARD, size)
    tfdata_readers.reset_skipped_records()
    for training in (False, True):
        keys = _keys(
            tfdata_readers.make_dataset(
                data_dir,
                "train",
                1,
                training=training,
                seed=0,
                with_metadata=True,
                skip_corrupt=True,
            )
        )
        assert sorted(keys) == sorted(expected[: 8 + 5] + expected[16:])
    assert tfdata_readers.skipped_records() == {str(data_dir / SHARD): 3}
    assert f"{SHARD} has {size} bytes; the manifest says {full}; skip_corrupt=True" in caplog.text
    with pytest.raises(tfdata_readers.ShardError, match=rf"{re.escape(SHARD)} has {size} bytes"):
        tfdata_readers.make_dataset(data_dir, "train", 4)  # without skip_corrupt: still refused


@pytest.mark.parametrize(
    "pipelines, replicas",
    [(2, 2), (1, 2)],
    ids=["2-pipelines", "1-pipeline-2-replicas"],
)
def test_skip_corrupt_under_tf_distribute_fails_rather_than_yield_fewer_batches(
    data_dir: pathlib.Path, pipelines: int, replicas: int
) -> None:
    """24 examples, global batch 2 x 2: every pipeline must yield 12 records' batches; one that lost
    records would yield fewer, so step counts would disagree (or a global step straddle two passes)."""
    shard_faults.flip_record_byte(data_dir / SHARD, 3, "data")  # shard 1 loses records 3-7
    for pipeline_id in range(pipelines):
        context = tf.distribute.InputContext(pipelines, pipeline_id, replicas)
        ds = tfdata_readers.make_dataset(
            data_dir,
            "train",
            2,
            input_context=context,
            training=True,
            seed=0,
            with_metadata=True,
            skip_corrupt=True,
        )
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"input pipeline \d of \d .* read fewer than the \d+ "
            r"records it needs for the \d+ batches of 2 that every pipeline must yield",
        ):
            _keys(ds)


def test_skip_corrupt_under_tf_distribute_tolerates_a_loss_the_share_can_spare(data_dir: pathlib.Path) -> None:
    """Global batch 5 x 2: 2 steps of 24 examples need 20 records; losing 1 leaves 23, so every batch is full."""
    shard_faults.flip_record_byte(data_dir / SHARD, 7, "data")
    context = tf.distribute.InputContext(1, 0, 2)
    ds = tfdata_readers.make_dataset(
        data_dir,
        "train",
        5,
        input_context=context,
        training=True,
        seed=0,
        with_metadata=True,
        skip_corrupt=True,
    )
    keys = _keys(ds)
    assert len(keys) == len(set(keys)) == 20


# A shard that changes after make_dataset: deleted or replaced. Run in a child process, so a
# reader that hangs (TensorFlow retries a file it cannot open for ever) fails the test at the
# deadline instead of hanging the suite. 20 shards, read one at a time with little read-ahead:
# "mid-iteration" changes the last one after the first batch, long before the reader opens it.
_LAST_SHARD = "train-00019-of-00020.tfrecord"


@pytest.fixture(scope="module")
def many_shards_dir(tmp_path_factory) -> pathlib.Path:
    return reader_fixtures.write_dataset(
        tmp_path_factory.mktemp("many") / "data",
        splits={"train": (240, 20)},
        image_size=(16, 16),
        seed=22,
    )


@pytest.fixture
def changing_dir(many_shards_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(many_shards_dir, tmp_path / "data"))


_CHANGE_AFTER_START = r"""
import os, shutil, sys
import tensorflow as tf
import tfdata_readers as tfr
data_dir, fault, victim, training, skip_corrupt, mid = sys.argv[1:]
dataset = tfr.make_dataset(
    data_dir, "train", 2, training=training == "1", seed=0, skip_corrupt=skip_corrupt == "1",
    cycle_length=1, num_parallel_reads=1, num_parallel_calls=1, prefetch=1, shuffle_files=False,
    shuffle_buffer_size=2,
)
iterator = iter(dataset)
if mid == "1":
    next(iterator)  # reading has started; the victim (the last shard) is opened much later
path = os.path.join(data_dir, victim)
if fault == "delete":
    os.remove(path)
elif fault == "replace":
    shutil.copyfile(os.path.join(data_dir, "train-00000-of-00020.tfrecord"), path)
try:
    for _ in iterator:
        pass
except tf.errors.OpError as e:
    print("ERROR", type(e).__name__, e.message.replace(chr(10), " "))
else:
    print("NO ERROR")
"""


@pytest.mark.parametrize("mid", [False, True], ids=["before", "mid-iteration"])
@pytest.mark.parametrize("training,skip_corrupt", [(False, False), (True, False), (False, True), (True, True)])
def test_shard_deleted_after_start_up_fails_naming_it(
    changing_dir: pathlib.Path, mid: bool, training: bool, skip_corrupt: bool
) -> None:
    data_dir, victim = changing_dir, _LAST_SHARD
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHANGE_AFTER_START,
            str(data_dir),
            "delete",
            victim,
            str(int(training)),
            str(int(skip_corrupt)),
            str(int(mid)),
        ],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERROR NotFoundError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert str(data_dir / victim) in proc.stdout


@pytest.mark.parametrize("training", [False, True])
def test_shard_replaced_after_start_up_fails_naming_it(changing_dir: pathlib.Path, training: bool) -> None:
    # Same record count (12), other records: the bytes the manifest lists no longer match.
    data_dir, victim = changing_dir, _LAST_SHARD
    proc = subprocess.run(
        [sys.executable, "-c", _CHANGE_AFTER_START, str(data_dir), "replace", victim, str(int(training)), "0", "1"],
        capture_output=True,
        text=True,
        env=_ENV,
        cwd=_REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERROR InvalidArgumentError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert f"shard {data_dir / victim} changed after start-up" in proc.stdout

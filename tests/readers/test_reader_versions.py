"""Versioned datasets (docs/FORMAT.md: shards/<run>/, versions/N.json): the reader picks a version once and keeps it."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
from versioned_fixtures import commit_append, commit_overwrite, examples_of, manifest_of, run_name, to_versioned

import tfdata_readers as tfr
from tfdata_readers.sources.manifest import shard_file_problem

_REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def appended(job_outputs, tmp_path: pathlib.Path) -> pathlib.Path:
    """Version 1: the base run (train 36 in 4 shards of 9); version 2: plus the addition run's
    smaller shards (an append: old shards plus new ones, unequal in size)."""
    out = tmp_path / "appended"
    to_versioned(job_outputs["base"], out, run=run_name(1))
    commit_append(out, job_outputs["addition"], run=run_name(2))
    return out


def _keys(dataset: tf.data.Dataset) -> list[str]:
    return [k.decode() for *_, meta in dataset for k in meta["key"].numpy()]


def _pairs(dataset: tf.data.Dataset) -> list[tuple[str, int]]:
    return [
        (k.decode(), int(label))
        for _, labels, meta in dataset
        for k, label in zip(meta["key"].numpy(), labels.numpy(), strict=True)
    ]


# Which manifest a version is read from.


def test_a_manifest_written_before_versioning_is_version_1(jpeg_dir: pathlib.Path) -> None:
    info = tfr.load_manifest(jpeg_dir)
    assert (info.version, info.parent_version) == (1, None)
    assert tfr.load_manifest(jpeg_dir, version=1).manifest_path == str(jpeg_dir / "dataset_info.json")
    with pytest.raises(
        tfr.VersionNotFoundError, match=r"version 2 of .*versions with a manifest: 1; the current version is 1"
    ):
        tfr.load_manifest(jpeg_dir, version=2)


def test_the_current_version_is_the_root_manifest_and_older_ones_come_from_versions(appended: pathlib.Path) -> None:
    current = tfr.load_manifest(appended)
    assert (current.version, current.parent_version) == (2, 1)
    assert current.manifest_path == str(appended / "dataset_info.json")
    old = tfr.load_manifest(appended, version=1)
    assert (old.version, old.parent_version) == (1, None)
    assert old.manifest_path == str(appended / "versions" / "00000001.json")
    assert old.split("train").num_examples == 36 and len(old.split("train").shards) == 4
    assert current.split("train").num_examples == 36 + manifest_of(appended)["change"]["added"]["train"]
    # Subfolder paths, resolved under the data dir.
    for shard in current.split("train").shards:
        assert shard.file.startswith("shards/") and shard.path == str(appended / shard.file)
    assert tfr.num_examples(appended, "train", version=1) == 36
    assert tfr.steps_per_epoch(appended, "train", 9, version=1) == 4
    assert sum(tfr.class_counts(appended, "train", version=1).values()) == 36


def test_each_version_reads_exactly_its_own_examples(appended: pathlib.Path) -> None:
    for version in (1, 2, None):
        got = _pairs(tfr.make_dataset(appended, "train", 8, with_metadata=True, version=version))
        assert sorted(got) == sorted(examples_of(appended, "train", version)), version
    assert len(examples_of(appended, "train", 2)) > len(examples_of(appended, "train", 1))


def test_the_root_is_authoritative_when_the_new_versions_history_copy_is_missing(job_outputs, tmp_path) -> None:
    """A kill right after the commit leaves no versions/00000002.json: version 2 is the root."""
    out = tmp_path / "d"
    to_versioned(job_outputs["base"], out, run=run_name(1))
    commit_append(out, job_outputs["addition"], run=run_name(2), history_copy=False)
    assert not (out / "versions" / "00000002.json").exists()
    assert tfr.load_manifest(out, version=2).manifest_path == str(out / "dataset_info.json")
    assert tfr.load_manifest(out).version == 2 and tfr.current_version(out) == 2
    assert tfr.load_manifest(out, version=1).split("train").num_examples == 36


def test_a_version_without_a_manifest_is_refused_naming_those_that_have_one(appended: pathlib.Path) -> None:
    with pytest.raises(tfr.VersionNotFoundError) as caught:
        tfr.make_dataset(appended, "train", 8, version=7)
    message = str(caught.value)
    assert "version 7" in message and str(appended / "versions" / "00000007.json") in message
    assert "versions with a manifest: 1, 2; the current version is 2" in message


@pytest.mark.parametrize("version", [0, -1, True, "2", 1.0])
def test_a_version_must_be_an_int_from_1(appended: pathlib.Path, version: object) -> None:
    with pytest.raises(ValueError, match=rf"version must be None .* or an int >= 1 \(got {version!r}\)"):
        tfr.load_manifest(appended, version=version)


def test_a_history_file_holding_another_version_is_refused(appended: pathlib.Path) -> None:
    (appended / "versions" / "00000001.json").write_bytes((appended / "dataset_info.json").read_bytes())
    with pytest.raises(ValueError, match=r"00000001.json holds version 2, not 1"):
        tfr.load_manifest(appended, version=1)


def test_an_older_version_whose_files_were_collected_says_so(appended: pathlib.Path) -> None:
    gone = appended / manifest_of(appended, 1)["splits"]["train"]["shards"][0]["file"]
    gone.unlink()
    with pytest.raises(
        tfr.ShardError,
        match=rf"shard {gone} is listed in the manifest but does not exist: version 1 "
        r"\(.*00000001.json\) is not the current version \(2\), and the writer deletes the files",
    ):
        tfr.make_dataset(appended, "train", 8, version=1)


# Shard paths with subfolders.


@pytest.mark.parametrize(
    "name",
    [
        "train-00000-of-00004.tfrecord",
        "shards/20261201T133000Z-3fa2c1d0/train-00000-of-00004.tfrecord",
    ],
)
def test_relative_posix_paths_are_accepted(name: str) -> None:
    assert shard_file_problem(name) == ""


@pytest.mark.parametrize(
    "name",
    [
        "/data/train-00000-of-00004.tfrecord",
        "../other/train-00000-of-00004.tfrecord",
        "shards/../../train-00000-of-00004.tfrecord",
        "shards\\run\\train-00000-of-00004.tfrecord",
        "shards//train-00000-of-00004.tfrecord",
        "shards/run/",
        "./train-00000-of-00004.tfrecord",
        "gs://bucket/train-00000-of-00004.tfrecord",
        "",
    ],
)
def test_paths_that_could_leave_the_data_dir_are_refused_naming_the_entry(appended: pathlib.Path, name: str) -> None:
    assert shard_file_problem(name)
    manifest = json.loads((appended / "dataset_info.json").read_text())
    manifest["splits"]["train"]["shards"][-1]["file"] = name
    (appended / "dataset_info.json").write_text(json.dumps(manifest))
    with pytest.raises(
        ValueError, match=r"split 'train': shard file .* is not (a path inside the data dir|a file name)"
    ) as caught:
        tfr.load_manifest(appended)
    assert repr(name) in str(caught.value)


# Old versions' files beside the current one's.


def test_an_overwritten_flat_dataset_reads_and_verifies_although_its_old_shards_remain(job_outputs, tmp_path) -> None:
    """After an overwrite of a dataset written before versioning, its root-level shards stay for the
    retention window, listed by versions/00000001.json: they are not stray shards. A file named
    like a shard that no manifest lists is one in the current version's run folder, and none of
    the dataset's business beside dataset_info.json (a user's own file, as the writer promises)."""
    out = tmp_path / "flat"
    shutil.copytree(job_outputs["base"], out)
    commit_overwrite(out, job_outputs["addition"], run=run_name(2))
    assert (out / "train-00000-of-00004.tfrecord").exists()
    assert sorted(_pairs(tfr.make_dataset(out, "train", 4, with_metadata=True))) == sorted(examples_of(out, "train"))
    assert tfr.verify(out) == []
    assert sorted(_pairs(tfr.make_dataset(out, "train", 4, with_metadata=True, version=1))) == sorted(
        examples_of(out, "train", 1)
    )
    shutil.copy(out / "train-00000-of-00004.tfrecord", out / "train-00009-of-00010.tfrecord")
    assert sorted(_pairs(tfr.make_dataset(out, "train", 4, with_metadata=True))) == sorted(examples_of(out, "train"))
    assert tfr.verify(out) == []
    stray = out / "shards" / run_name(2) / "train-00009-of-00010.tfrecord"
    shutil.copy(out / "train-00000-of-00004.tfrecord", stray)
    with pytest.raises(
        tfr.ShardError, match=r"train-00009-of-00010.tfrecord look\(s\) like shard\(s\) of split 'train'"
    ):
        tfr.make_dataset(out, "train", 4)
    assert [(p.path, p.problem) for p in tfr.verify(out)] == [
        (str(stray), "named like a shard but not listed in dataset_info.json")
    ]


def test_an_append_to_a_flat_dataset_reads_its_root_level_and_subfolder_shards(job_outputs, tmp_path) -> None:
    out = tmp_path / "flat"
    shutil.copytree(job_outputs["base"], out)
    manifest = commit_append(out, job_outputs["addition"], run=run_name(2))
    files = [s["file"] for s in manifest["splits"]["train"]["shards"]]
    assert files[0] == "train-00000-of-00004.tfrecord" and files[-1].startswith(f"shards/{run_name(2)}/")
    assert sorted(_pairs(tfr.make_dataset(out, "train", 4, with_metadata=True))) == sorted(examples_of(out, "train"))
    assert tfr.verify(out) == [] and tfr.verify(out, version=1) == []


# A reader keeps its version while newer ones are committed.


def test_a_dataset_reads_the_version_current_when_it_was_built(appended: pathlib.Path, job_outputs) -> None:
    dataset = tfr.make_dataset(appended, "train", 8, with_metadata=True)
    before = sorted(examples_of(appended, "train", 2))
    commit_overwrite(appended, job_outputs["base"], run=run_name(3))
    assert tfr.current_version(appended) == 3
    for _ in range(2):  # two passes, both after the commit
        assert sorted(_pairs(dataset)) == before
    assert sorted(_pairs(tfr.make_dataset(appended, "train", 8, with_metadata=True))) == sorted(
        examples_of(appended, "train", 3)
    )


class _CommitMidEpoch(tf.keras.callbacks.Callback):
    """Commits the next version (new shards in a new run folder, root replaced with os.replace)
    in the middle of epoch `epoch`, as a conversion run finishing during training would."""

    def __init__(self, commit, epoch: int, batch: int) -> None:
        super().__init__()
        self._commit, self._epoch, self._batch = commit, epoch, batch
        self.committed = threading.Event()

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._current = epoch

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self._current == self._epoch and batch == self._batch and not self.committed.is_set():
            self._commit()
            self.committed.set()


def test_keras_fit_reads_version_n_whole_every_epoch_while_version_n_plus_1_is_committed(
    appended: pathlib.Path, job_outputs
) -> None:
    """Four epochs of fit on version 2; version 3 (an overwrite with other examples and labels) is
    committed during epoch 2. Every epoch delivers every example of version 2 exactly once, with
    version 2's label."""
    expected = collections.Counter(examples_of(appended, "train", 2))
    seen: list[tuple[str, int]] = []

    def record(keys, labels):
        seen.extend((k.decode(), int(label)) for k, label in zip(keys, labels, strict=True))
        return keys.shape[0]

    def observed(images, labels, meta):
        counted = tf.numpy_function(record, [meta["key"], labels], tf.int64, stateful=True)
        with tf.control_dependencies([counted]):
            return tf.identity(images), labels

    dataset = tfr.make_dataset(appended, "train", 4, with_metadata=True, image_size=16).map(observed)
    commit = _CommitMidEpoch(lambda: commit_overwrite(appended, job_outputs["base"], run=run_name(3)), epoch=1, batch=2)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16, 16, 3)),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(9),
        ]
    )
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=4, verbose=0, callbacks=[commit], shuffle=False)
    assert commit.committed.is_set() and tfr.current_version(appended) == 3
    assert manifest_of(appended)["splits"]["train"]["num_examples"] == 36  # version 3 differs from 2
    per_epoch = sum(expected.values())
    assert len(seen) == 4 * per_epoch
    for epoch in range(4):
        assert collections.Counter(seen[epoch * per_epoch : (epoch + 1) * per_epoch]) == expected, epoch


# Equal shares when shards differ in size.


def _context(pipelines: int, pipeline_id: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines
    )


@pytest.mark.parametrize("pipelines", [2, 3])
def test_input_pipelines_get_equal_shares_of_old_and_new_unequal_shards(appended: pathlib.Path, pipelines: int) -> None:
    sizes = [s.num_examples for s in tfr.load_manifest(appended).split("train").shards]
    assert len(set(sizes)) > 1, sizes  # the appended shards are smaller
    expected = sorted(k for k, _ in examples_of(appended, "train"))
    steps = tfr.steps_per_epoch(appended, "train", 2 * pipelines)
    eval_keys, eval_counts, train_batches = [], [], []
    for pipeline_id in range(pipelines):
        context = _context(pipelines, pipeline_id)
        keys = _keys(tfr.make_dataset(appended, "train", 2, input_context=context, with_metadata=True))
        eval_keys += keys
        eval_counts.append(len(keys))
        train = tfr.make_dataset(appended, "train", 2, input_context=context, with_metadata=True, training=True, seed=1)
        train_batches.append([len(meta["key"]) for *_, meta in train])
    assert sorted(eval_keys) == expected  # every example exactly once
    assert max(eval_counts) - min(eval_counts) <= 1, eval_counts
    assert train_batches == [[2] * steps] * pipelines  # equal, full steps for every pipeline


@pytest.mark.slow
def test_mirrored_replicas_get_equal_shares_and_keep_their_version(
    appended: pathlib.Path, job_outputs, tmp_path
) -> None:
    """MirroredStrategy over 2 and 3 logical CPUs on the appended version (unequal shards): see
    versioned_mirrored_check.py for what each check asserts."""
    out = tmp_path / "results.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(_REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            str(pathlib.Path(__file__).with_name("versioned_mirrored_check.py")),
            str(out),
            str(appended),
            str(job_outputs["base"]),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert sorted(results) == sorted(
        f"replicas={r} {check}" for r in (2, 3) for check in ("eval", "train", "train repeat", "commit mid-read")
    )
    assert {name: problem for name, problem in results.items() if problem} == {}


# verify and inspect.


def _verify(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tfdata_readers.verify", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=600,
    )


def test_verify_says_which_version_it_checked_and_checks_that_versions_files(appended: pathlib.Path) -> None:
    current = _verify(str(appended))
    assert current.returncode == 0, current.stderr
    shards = len(manifest_of(appended)["splits"]["train"]["shards"]) + len(
        manifest_of(appended)["splits"]["validation"]["shards"]
    )
    assert current.stdout.splitlines() == [
        f"version 2 of 2: checked {shards} shard(s) of split(s) train, validation: 0 problem(s)"
    ]
    # A byte of one of version 1's shards changed in place: same size, another sha256.
    old = appended / manifest_of(appended, 1)["splits"]["train"]["shards"][0]["file"]
    data = bytearray(old.read_bytes())
    data[-1] ^= 0xFF
    old.write_bytes(bytes(data))
    first = _verify(str(appended), "--version", "1", "--split", "train")
    assert first.returncode == 1
    assert first.stdout.splitlines() == ["version 1 of 2: checked 4 shard(s) of split(s) train: 2 problem(s)"]
    assert first.stderr.splitlines()[0].startswith(f"MISMATCH {old}: sha256 ")
    missing = _verify(str(appended), "--version", "5")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("ERROR version 5 of ") and "versions with a manifest: 1, 2" in missing.stderr


def test_verify_refuses_a_dead_letters_file_outside_the_data_dir(appended: pathlib.Path) -> None:
    manifest = json.loads((appended / "dataset_info.json").read_text())
    manifest["dead_letters_file"] = "../dead_letters.jsonl"
    (appended / "dataset_info.json").write_text(json.dumps(manifest))
    problems = [p.problem for p in tfr.verify(appended, ["validation"])]
    assert any(
        p.startswith("dead_letters_file '../dead_letters.jsonl' is not a path inside the data dir") for p in problems
    )


def test_inspect_gathers_one_version(appended: pathlib.Path) -> None:
    from tfdata_readers.inspection.gather import gather

    report = gather(appended, num_examples=4, scan=8, version=1, splits=["validation"])
    assert report.info.version == 1
    assert [row.file for row in report.shards if row.split == "train"] == [
        s["file"] for s in manifest_of(appended, 1)["splits"]["train"]["shards"]
    ]
    assert all(row.verified for row in report.shards) and not report.other_problems

"""Checks a dataset against its manifest: declared features, dead letters, unlisted shards, and each
shard's bytes, sha256 and records."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from tfdata_readers.checking.annotations import annotation_problems
from tfdata_readers.checking.leakage import LeakageNotChecked, leakage_command_lines
from tfdata_readers.decoding.parse import (
    FEATURE_DTYPES,
    check_declared_features,
    feature_spec,
    list_feature_spec,
    record_problem,
)
from tfdata_readers.decoding.targets import list_keys
from tfdata_readers.sources import storage
from tfdata_readers.sources.files import unlisted_shards
from tfdata_readers.sources.manifest import (
    MANIFEST_NAME,
    DatasetInfo,
    ShardInfo,
    current_version,
    read_manifest,
    relative_file_problem,
    shard_file_problem,
)
from tfdata_readers.sources.records import RECORD_OVERHEAD, tensorflow_reason

__all__ = ["ShardProblem", "verify", "verify_command"]

_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class ShardProblem:
    """One mismatch between a file of the dataset (a shard, or the manifest itself) and the manifest."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_problem(record: bytes, info: DatasetInfo) -> str:
    """How a record that parses disagrees with the manifest ("" if it does not): its image's height,
    width, channels or format differ from `image`, or its label is not an index of `label_names`
    or names another class than its `image/class/text`."""
    features = tf.train.Example.FromString(record).features.feature

    def value(key: str) -> Any:
        feature = features[key]
        return (
            feature.int64_list.value[0] if feature.WhichOneof("kind") == "int64_list" else feature.bytes_list.value[0]
        )

    image = info.image
    found = []
    for key, expected in (("height", image.height), ("width", image.width), ("channels", image.channels)):
        if expected is None:  # each image its own size: any size, but a size
            if value(f"image/{key}") < 1:
                found.append(f"image/{key} {value(f'image/{key}')}, not a size")
        elif value(f"image/{key}") != expected:
            found.append(f"image/{key} {value(f'image/{key}')}, manifest image.{key} says {expected}")
    fmt = value("image/format").decode(errors="replace")
    if fmt.upper() != image.format:
        found.append(f"image/format {fmt!r}, manifest image.format says {image.format!r}")
    if info.task != "classification":
        found += annotation_problems(features, info, (value("image/width"), value("image/height")))
        return "; ".join(found)
    label, text = value("image/class/label"), value("image/class/text").decode(errors="replace")
    if not 0 <= label < min(info.num_classes, len(info.label_names)):
        found.append(f"label {label}, not in [0, num_classes={info.num_classes})")
    elif info.label_names[label] != text:
        found.append(
            f"label {label} is {info.label_names[label]!r} in label_names but the record's class text is {text!r}"
        )
    return "; ".join(found)


def _read_records(
    path: str, spec: Mapping[str, tf.io.FixedLenFeature], info: DatasetInfo | None = None
) -> tuple[int, list[str]]:
    """(records read, problems): the first unreadable record, the first that `spec` cannot parse and
    the first that disagrees with the manifest `info` (see `content_problem`), each with its index and
    byte offset."""
    count = offset = 0
    problems: list[str] = []
    parse_failed = content_failed = False
    try:
        for tensor in tf.data.TFRecordDataset(path, buffer_size=_CHUNK):
            record = tensor.numpy()
            if not parse_failed and (problem := record_problem(record, spec)):
                problems.append(f"record {count} at byte offset {offset} {problem}")
                parse_failed = True
            elif (
                info is not None
                and not parse_failed
                and not content_failed
                and (problem := content_problem(record, info))
            ):
                problems.append(f"record {count} at byte offset {offset} disagrees with {MANIFEST_NAME}: {problem}")
                content_failed = True
            count += 1
            offset += len(record) + RECORD_OVERHEAD
    except tf.errors.OpError as e:
        reason = tensorflow_reason(e.message)
        reason = reason[: -len(f" at {offset}")] if reason.endswith(f" at {offset}") else reason
        problems.insert(0, f"unreadable from record {count} (byte {offset}): {reason}")
        return -1, problems
    return count, problems


def _check_shard(
    shard: ShardInfo, spec: Mapping[str, tf.io.FixedLenFeature], info: DatasetInfo | None = None
) -> list[ShardProblem]:
    if not storage.exists(shard.path):
        return [ShardProblem(shard.path, "missing")]
    problems = []
    size = storage.size(shard.path)
    if size != shard.bytes:
        problems.append(ShardProblem(shard.path, f"{size} bytes, manifest says {shard.bytes}"))
    # On S3 the shard is read from a temporary download: as it is, whatever its digest.
    with storage.local_copy(shard.path) as local:
        sha = _sha256(local)
        if sha != shard.sha256:
            problems.append(ShardProblem(shard.path, f"sha256 {sha}, manifest says {shard.sha256}"))
        count, record_problems = _read_records(local, spec, info)
    problems.extend(ShardProblem(shard.path, p) for p in record_problems)
    # A shard cut at a record boundary reads without error: only the manifest's count shows the loss.
    if count >= 0 and count != shard.num_examples:
        problems.append(ShardProblem(shard.path, f"{count} records, manifest says {shard.num_examples}"))
    return problems


DEAD_LETTERS_FILE = "dead_letters.jsonl"
DEAD_LETTER_FIELDS = ("uri", "stage", "reason", "detail")


def _check_dead_letters(data_dir: str, raw: Mapping[str, Any], manifest_path: str) -> list[ShardProblem]:
    """The dead-letter file (docs/FORMAT.md: always present, possibly empty; in a versioned dataset
    `shards/<run>/dead_letters.jsonl`, the run that made the version's change) exists, each line is
    a JSON object with the format's fields, and its line count matches `num_dead_letters`."""
    name = raw.get("dead_letters_file", DEAD_LETTERS_FILE)
    if problem := relative_file_problem(name, "dead_letters_file"):
        return [ShardProblem(manifest_path, problem)]
    path = os.path.join(data_dir, name)
    if not storage.exists(path):
        return [ShardProblem(path, f"missing; {MANIFEST_NAME} names it and the format says it is always present")]
    lines = [line for line in storage.read_bytes(path).decode("utf-8").splitlines() if line.strip()]
    problems = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(ShardProblem(path, f"line {number} is not JSON ({e})"))
            break
        lacking = [k for k in DEAD_LETTER_FIELDS if not isinstance(entry, dict) or k not in entry]
        if lacking:
            problems.append(ShardProblem(path, f"line {number} lacks field(s) {lacking}"))
            break
        mistyped = {k: type(entry[k]).__name__ for k in DEAD_LETTER_FIELDS if not isinstance(entry[k], str)}
        if mistyped:
            problems.append(ShardProblem(path, f"line {number} has non-string field(s) {mistyped}; FORMAT.md says str"))
            break
    declared = raw.get("num_dead_letters")
    if declared is not None and declared != len(lines):
        problems.append(ShardProblem(path, f"{len(lines)} dead letter(s), {MANIFEST_NAME} says {declared!r}"))
    return problems


def verify(
    data_dir: str | os.PathLike[str], splits: Sequence[str] | None = None, *, version: int | None = None
) -> list[ShardProblem]:
    """Every problem found in the shards of `splits` (all splits by default) of `version` (None:
    the current one, the root dataset_info.json; N: that version, see `load_manifest`); empty
    means all good.

    Besides each listed shard (its bytes, sha256, record count, and every record's keys, dtypes,
    image size, channels and format, and label against `num_classes` and `label_names`), it
    reports the manifest's structural problems (`read_manifest`: a shard listed twice or in two
    splits, a path leaving the data dir, `num_classes` != `len(label_names)`, a wrong `num_shards`),
    features the manifest declares differently from the format, a missing or malformed dead-letter
    file (a line that is not a JSON object of string `uri`, `stage`, `reason`, `detail`, or a line
    count that differs from `num_dead_letters`), and files in the folders holding its shards named
    like a shard of these splits (of any split, by default) that neither this manifest nor any in
    versions/ lists (a user's own files beside dataset_info.json are not the dataset's). A
    shard whose path leaves the data dir is not opened; one listed twice is checked once. A manifest
    it cannot parse, or one of a newer schema_version, raises.
    """
    info, manifest_problems = read_manifest(data_dir, version)
    return _verify_info(info, manifest_problems, splits)


def _verify_info(info: DatasetInfo, manifest_problems: list[str], splits: Sequence[str] | None) -> list[ShardProblem]:
    """`verify` of a manifest already read (so the CLI checks and reports one and the same version)."""
    manifest_path = info.manifest_path
    names = list(splits) if splits else sorted(info.splits)
    keys = list(FEATURE_DTYPES)
    if info.task != "classification":  # the class id and name are lists: annotation_problems checks them
        keys = [key for key in keys if key not in ("image/class/label", "image/class/text")]
    problems = [ShardProblem(manifest_path, p) for p in manifest_problems]
    problems += [ShardProblem(manifest_path, p) for p in check_declared_features(keys, info.features)]
    if info.task != "classification":
        try:
            list_feature_spec(list_keys(info.task), info.features)
        except ValueError as error:
            problems.append(ShardProblem(manifest_path, str(error)))
    spec = feature_spec(keys)
    problems.extend(_check_dead_letters(info.data_dir, info.raw, manifest_path))
    for path in unlisted_shards(info, splits or None):
        problems.append(ShardProblem(path, f"named like a shard but not listed in {MANIFEST_NAME}"))
    outside = {
        os.path.join(info.data_dir, str(s.get("file")))
        for split in info.raw["splits"].values()
        for s in split["shards"]
        if shard_file_problem(s.get("file"))
    }
    checked: set[str] = set()
    for name in names:
        for shard in info.split(name).shards:
            if shard.path in outside or shard.path in checked:
                continue
            checked.add(shard.path)
            problems.extend(_check_shard(shard, spec, info))
    return problems


def verify_command(
    data_dir: str,
    *,
    splits: Sequence[str] | None,
    version: int | None,
    leakage: bool = False,
    near_copy_bits: int | None = None,
) -> int:
    """Checks a dataset and prints what the command prints; returns its exit status."""
    try:
        info, manifest_problems = read_manifest(data_dir, version)
        problems = _verify_info(info, manifest_problems, splits)
        current = current_version(info.data_dir)
    except (OSError, ValueError) as e:  # no manifest or version, bad JSON, newer schema_version, unknown split
        print(f"ERROR {e}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    names = splits or sorted(info.splits)
    total = sum(len(info.split(n).shards) for n in names)
    print(
        f"{_version_line(info.version, current)}: checked {total} shard(s) of split(s) {', '.join(names)}: "
        f"{len(problems)} problem(s)"
    )
    leaks = 0
    if leakage:
        try:
            leaks, lines = leakage_command_lines(info, bits=near_copy_bits)
        except LeakageNotChecked as refused:
            print(f"ERROR {refused}", file=sys.stderr)
            return 1
        for line in lines:
            print(line, file=sys.stderr if line.startswith(("LEAK", "...")) else sys.stdout)
    return 1 if problems or leaks else 0


def _version_line(version: int, current: int | None) -> str:
    """ "version 3 of 3" (the current one), "version 2 of 3", or without a current root manifest "version 2"."""
    return (
        f"version {version} of {current}" if current is not None else f"version {version} (no current {MANIFEST_NAME})"
    )

"""A staged shard's sidecar: what it records of the shard and its inputs, how --resume verifies a
staged shard by it, and the ShardResult it reports."""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass, field

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import BadInputError
from beam_jobs.planning.rules import ShardPlan
from beam_jobs.records import DeadLetter, InputFile, ShardResult, annotation_digest, content_label
from beam_jobs.writing.example_conversion import ExampleClasses

__all__ = ["ShardContents", "shard_fingerprint", "shard_result", "sidecar_record", "verified_sidecar"]


def shard_fingerprint(shard: ShardPlan, run_fingerprint: str) -> str:
    """Identifies what a shard must contain: the run's settings and the shard's inputs (names and
    labels; their contents are checked separately, see ``source_state``)."""
    listing = [[f.filename, f.uri, f.label, f.label_id] for f in shard.inputs]
    if any(f.annotations is not None for f in shard.inputs):
        # Only for annotated inputs, so that the shards of earlier releases keep their fingerprints.
        listing.append([repr(f.annotations) for f in shard.inputs])
    text = json.dumps([run_fingerprint, shard.split, shard.index, shard.num_shards, listing])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class ShardContents:
    """What converting a shard's inputs found, in plan order, for its sidecar: filled while the
    shard is written, so nothing is read twice."""

    # (sha256, filename, label) of each example: the duplicate report groups by them
    content_keys: list[tuple[str, str, str]] = field(default_factory=list)
    # sha256 of each input's source bytes (and its mask's) by filename, dead letters read included
    digests: dict[str, str] = field(default_factory=dict)
    mask_digests: dict[str, str] = field(default_factory=dict)
    # Annotated examples: [image-level classes, object classes, objects cut by the crop] each
    annotated: list[list] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    num_examples: int = 0

    @property
    def num_done(self) -> int:
        """The inputs done so far, examples and dead letters alike."""
        return self.num_examples + len(self.dead_letters)

    def add_example(self, input_file: InputFile, sha256: str, classes: ExampleClasses | None) -> None:
        """Records an example just written: its content key and, annotated, what it holds."""
        self.num_examples += 1
        self.content_keys.append((sha256, input_file.filename, content_label(input_file)))
        if classes is not None:
            held = [list(classes.classes), list(classes.objects), classes.dropped]
            self.annotated.append([*held, list(classes.mask_ids)] if classes.mask_ids else held)

    def add_dead_letter(self, input_file: InputFile, error: BadInputError, data: bytes | BadInputError) -> None:
        """Records an unusable input's dead letter and, when it was read, its bytes' sha256."""
        self.dead_letters.append(DeadLetter(input_file.uri, error.stage, error.reason, error.detail))
        if isinstance(data, bytes):  # read, then refused: a touch of it must not count as a change
            self.digests[input_file.filename] = hashlib.sha256(data).hexdigest()


def sidecar_record(
    shard: ShardPlan,
    contents: ShardContents,
    *,
    size: int,
    sha256: str,
    fingerprint: str,
    sources: list,
    run_facts: dict,
) -> dict:
    """The sidecar of a shard just written, as a plain dict: ``size`` and ``sha256`` are the shard
    file's, ``sources`` the inputs' source_state, ``run_facts`` what the run adds (its id, its
    fingerprint, its purpose and its preprocessing, where it has them)."""
    done = {
        "fingerprint": fingerprint,
        "sources": sources,
        # Which inputs this shard was made from (in plan order, as ``sources``): --append reads
        # it to convert only the inputs that the current version does not hold yet.
        "inputs": [input_file.uri for input_file in shard.inputs],
        # ... who each is (its path relative to its source's root) and what its bytes were: an
        # append knows a held input by them wherever its folder is mounted, and compares bytes
        # when its size or time differ (``sources`` is only a hint; see reading.source_digests).
        "input_filenames": [input_file.filename for input_file in shard.inputs],
        "input_sha256": [_source_digests(f, contents.digests, contents.mask_digests) for f in shard.inputs],
        # ... and what the plan made of each (its label), and the shard's split: an input
        # relabelled or moved to another split since is a changed input, never silently kept.
        "input_labels": [input_file.label for input_file in shard.inputs],
        "split": shard.split,
        "file": shard.file_name,
        "num_examples": contents.num_examples,
        "bytes": size,
        "sha256": sha256,
        "dead_letters": [[d.uri, d.stage, d.reason, d.detail] for d in contents.dead_letters],
        "content_keys": contents.content_keys,
    }
    if contents.annotated:
        done["annotated"] = contents.annotated
    if any(f.phash is not None or f.split_group is not None or f.user_group is not None for f in shard.inputs):
        # --split_groups: each input's perceptual signature (hex, None where it had none), group id
        # and user group, so that an append groups new inputs with the held ones, and a check of
        # the dataset (verify-tfrecords --leakage) reads the signatures, without decoding again.
        done["input_phash"] = [None if f.phash is None or f.phash < 0 else f"{f.phash:032x}" for f in shard.inputs]
        done["input_groups"] = [input_file.split_group for input_file in shard.inputs]
        done["input_user_groups"] = [input_file.user_group for input_file in shard.inputs]
    if any(input_file.annotations is not None for input_file in shard.inputs):
        # ... and what each input's annotations said: boxes redrawn since make it a changed input.
        done["input_annotations"] = [annotation_digest(input_file) for input_file in shard.inputs]
    return {**done, **run_facts}


def _source_digests(input_file: InputFile, digests: dict[str, str], mask_digests: dict[str, str]) -> list:
    """[sha256 of the source's bytes], then its mask's when it has one (None where unread), in the
    shape of reading.source_digests."""
    annotations = input_file.annotations
    with_mask = annotations is not None and annotations.mask_uri is not None
    found = [digests.get(input_file.filename)]
    return [*found, mask_digests.get(input_file.filename)] if with_mask else found


def shard_result(shard: ShardPlan, done: dict) -> ShardResult:
    """The shard's facts for the manifest, from its sidecar: a shard kept by --resume (even one
    staged by an older version) reports the same counts as a freshly converted one."""
    objects: collections.Counter[str] = collections.Counter()
    dropped = 0
    mask_ids: set[int] = set()
    if "annotated" in done:
        # [classes, objects, cut] and, with a semantic mask, its ids.
        classes = collections.Counter(name for names, *_ in done["annotated"] for name in names)
        objects.update(name for _, names, *_ in done["annotated"] for name in names)
        dropped = sum(cut for _, _, cut, *_ in done["annotated"])
        mask_ids.update(i for _, _, _, *ids in done["annotated"] for i in (ids[0] if ids else ()))
    else:
        classes = collections.Counter(label for _, _, label in done["content_keys"])
    reasons = collections.Counter(reason for _, _, reason, _ in done["dead_letters"])
    return ShardResult(
        split=shard.split,
        index=shard.index,
        num_shards=shard.num_shards,
        file=shard.file_name,
        num_examples=done["num_examples"],
        bytes=done["bytes"],
        sha256=done["sha256"],
        class_counts=tuple(sorted(classes.items())),
        dead_letters_by_reason=tuple(sorted(reasons.items())),
        object_counts=tuple(sorted(objects.items())),
        mask_ids=tuple(sorted(mask_ids)),
        objects_cut=dropped,
    )


def verified_sidecar(staged_path: str, sidecar_path: str, fingerprint: str, sources: list) -> dict | None:
    """The sidecar of a staged shard when the shard on disk is exactly what this run would write:
    the same settings and inputs, every source unchanged since, and the file intact."""
    try:
        if not (FileSystems.exists(staged_path) and FileSystems.exists(sidecar_path)):
            return None
        with FileSystems.open(sidecar_path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            done = json.loads(handle.read().decode("utf-8"))
        if done.get("fingerprint") != fingerprint or done.get("sources") != sources:
            return None
        if _file_sha256(staged_path) != (done["bytes"], done["sha256"]):
            return None
        return done
    except (OSError, ValueError, KeyError):
        return None


def _file_sha256(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()

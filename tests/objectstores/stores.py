"""Helpers shared by the object-store tests: uploading a tree, reading a dataset back, comparing it
with the local-disk run, and finding leaked secrets."""

from __future__ import annotations

import difflib
import json
import pathlib
import re

from tests.dataset_files import flat_manifest

__all__ = ["assert_matches_local", "assert_no_secret", "dataset_names", "normalise", "normalise_names"]

_RUN = re.compile(r"shards/\d{8}T\d{6}Z-[0-9a-f]{8}/")
# Files that hold the run's own facts (its name, its sources' modification times): present in
# both, compared by name only.
_SIDECAR = re.compile(r"^shards/<run>/\..+\.tfrecord\.json$")


def normalise_names(name: str) -> str:
    """A file's name in a dataset folder with its run folder's name replaced by a placeholder."""
    return _RUN.sub("shards/<run>/", name)


def normalise(data: bytes, *, input_root: str, output_root: str) -> bytes:
    """The bytes with the run's input and output roots replaced by placeholders: the only thing that
    may differ between a store run and a local-disk run (dead letters name their input's uri)."""
    return data.replace(input_root.rstrip("/").encode(), b"<input>").replace(
        output_root.rstrip("/").encode(), b"<output>"
    )


def dataset_names(reference: pathlib.Path) -> list[str]:
    """What a finished dataset folder holds (relative names, run folders as "shards/<run>/"): the
    manifest, its history copy, the run's shards, sidecars and dead letters. Not the local commit
    lock file, which object stores do without."""
    return sorted(
        normalise_names(p.relative_to(reference).as_posix())
        for p in reference.rglob("*")
        if p.is_file() and p.name != ".commit.lock"
    )


def _comparable_manifest(data: bytes) -> bytes:
    return json.dumps(flat_manifest(json.loads(data)), indent=2, sort_keys=True).encode()


def assert_matches_local(
    got: dict[str, bytes], reference: pathlib.Path, *, input_root: str, output_root: str, reference_input: str
) -> None:
    """``got`` ({name: bytes} of everything the store run left in its output) equals the local run:

    - the same names, and nothing else (no temp, probe or lock objects), run folders compared as
      "shards/<run>/" (each run names its own);
    - shards byte-identical;
    - dataset_info.json and its history copy equal once both runs' roots and run names are
      replaced by placeholders and the commit's own facts (version, time, run) dropped;
    - dead_letters.jsonl: the same lines once normalised. Their order is not compared: the job
      writes dead letters in parts chosen by a hash of each input's full uri, so a different root
      orders them differently (a rerun on the same root is byte-identical).
    """
    want = {
        normalise_names(p.relative_to(reference).as_posix()): p.read_bytes()
        for p in reference.rglob("*")
        if p.is_file() and p.name != ".commit.lock"
    }
    got = {normalise_names(name): data for name, data in got.items()}
    assert sorted(got) == sorted(want), f"objects differ from the local run's files: {sorted(got)} vs {sorted(want)}"
    for name, data in want.items():
        if _SIDECAR.match(name):
            continue
        mine = normalise(got[name], input_root=input_root, output_root=output_root)
        theirs = normalise(data, input_root=reference_input, output_root=str(reference))
        if name == "dataset_info.json" or name.startswith("versions/"):
            mine, theirs = _comparable_manifest(mine), _comparable_manifest(theirs)
        if name.endswith("dead_letters.jsonl"):
            assert sorted(mine.splitlines()) == sorted(theirs.splitlines()) and mine.count(b"\n") == theirs.count(b"\n")
        else:
            assert mine == theirs, f"{name} differs from the local run's:\n" + "\n".join(
                difflib.unified_diff(
                    theirs.decode("utf-8", "replace").splitlines(),
                    mine.decode("utf-8", "replace").splitlines(),
                    "local",
                    "store",
                    lineterm="",
                )
            )


def assert_no_secret(secrets: list[str], **outputs: bytes | str) -> None:
    """No secret appears in any of the named outputs (logs, objects, files)."""
    for where, data in outputs.items():
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        for secret in secrets:
            assert secret not in text, f"a credential appears in {where}"

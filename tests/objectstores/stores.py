"""Helpers shared by the object-store tests: uploading a tree, reading a dataset back, comparing it
with the local-disk run, and finding leaked secrets."""

from __future__ import annotations

import pathlib

__all__ = ["assert_matches_local", "assert_no_secret", "dataset_names", "normalise"]


def normalise(data: bytes, *, input_root: str, output_root: str) -> bytes:
    """The bytes with the run's input and output roots replaced by placeholders: the only thing that
    may differ between a store run and a local-disk run (dead letters name their input's uri)."""
    return (data.replace(input_root.rstrip("/").encode(), b"<input>")
            .replace(output_root.rstrip("/").encode(), b"<output>"))


def dataset_names(reference: pathlib.Path) -> list[str]:
    """What a finished dataset holds under its final names: shards, dataset_info.json, dead letters."""
    return sorted(p.name for p in reference.iterdir() if p.is_file() and not p.name.startswith("."))



def assert_matches_local(got: dict[str, bytes], reference: pathlib.Path, *, input_root: str,
                         output_root: str, reference_input: str) -> None:
    """``got`` ({name: bytes} of everything the store run left in its output) equals the local run:

    - the same names, and nothing else (no temp, staged, probe or lock objects);
    - shards byte-identical;
    - dataset_info.json byte-identical once both runs' roots are replaced by placeholders;
    - dead_letters.jsonl: the same lines once normalised. Their order is not compared: the job
      writes dead letters in parts chosen by a hash of each input's full uri, so a different root
      orders them differently (a rerun on the same root is byte-identical).
    """
    want = {name: (reference / name).read_bytes() for name in dataset_names(reference)}
    assert sorted(got) == sorted(want), f"objects differ from the local run's files: {sorted(got)} vs {sorted(want)}"
    for name, data in want.items():
        mine = normalise(got[name], input_root=input_root, output_root=output_root)
        theirs = normalise(data, input_root=reference_input, output_root=str(reference))
        if name == "dead_letters.jsonl":
            assert sorted(mine.splitlines()) == sorted(theirs.splitlines()) and mine.count(b"\n") == theirs.count(b"\n")
        else:
            assert mine == theirs, f"{name} differs from the local run's"


def assert_no_secret(secrets: list[str], **outputs: bytes | str) -> None:
    """No secret appears in any of the named outputs (logs, objects, files)."""
    for where, data in outputs.items():
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        for secret in secrets:
            assert secret not in text, f"a credential appears in {where}"

"""A dataset folder as tests look at it: through its manifest, or flattened to the files of its
current version.

A version's files live in run folders (``shards/<run>/``) whose names differ on every run, and its
manifest records when and by which run it was committed. Tests that compare the output of two
runs (two runners, a store and local disk) compare the current version's files by their names in
the run folder, and the manifest without those keys.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

__all__ = [
    "RUN_KEYS",
    "as_older_release",
    "tree_files",
    "current_files",
    "dead_letters",
    "dead_letters_path",
    "flat_manifest",
    "flat_names",
    "shard_paths",
    "without_run_names",
]

# What differs between two runs that wrote the same dataset: who committed it, and when.
RUN_KEYS = ("version", "parent_version", "committed_at", "change")
_RUN_PREFIX = re.compile(r"shards/\d{8}T\d{6}Z-[0-9a-f]{8}/")


def without_run_names(text: str) -> str:
    """Drops the run-folder prefix from every file name in ``text``."""
    return _RUN_PREFIX.sub("", text)


def _manifest(out: pathlib.Path) -> dict:
    return json.loads((pathlib.Path(out) / "dataset_info.json").read_text(encoding="utf-8"))


def dead_letters_path(out: pathlib.Path) -> pathlib.Path:
    """The dead letters of the current version, or, with no manifest (a refused run), those of
    the newest run folder."""
    out = pathlib.Path(out)
    if (out / "dataset_info.json").exists():
        return out / _manifest(out)["dead_letters_file"]
    runs = sorted((out / "shards").iterdir())
    return runs[-1] / "dead_letters.jsonl"


def dead_letters(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in dead_letters_path(out).read_text(encoding="utf-8").splitlines() if line]


def shard_paths(out: pathlib.Path, split: str | None = None) -> list[pathlib.Path]:
    """The shard files of the current version (of one split), in manifest order."""
    info = _manifest(out)
    return [
        pathlib.Path(out) / shard["file"]
        for name, facts in info["splits"].items()
        if split in (None, name)
        for shard in facts["shards"]
    ]


def flat_manifest(info: dict) -> dict:
    """The manifest without what differs between runs (RUN_KEYS, run-folder prefixes)."""
    return json.loads(without_run_names(json.dumps({k: v for k, v in info.items() if k not in RUN_KEYS})))


def current_files(out: pathlib.Path) -> dict[str, bytes]:
    """{name: bytes} of the current version: dataset_info.json (flattened, see flat_manifest), its
    dead letters as "dead_letters.jsonl" and its shards by their names in the run folder."""
    out = pathlib.Path(out)
    info = _manifest(out)
    files = {
        "dataset_info.json": (json.dumps(flat_manifest(info), indent=2, sort_keys=True) + "\n").encode(),
        "dead_letters.jsonl": (out / info["dead_letters_file"]).read_bytes(),
    }
    for path in shard_paths(out):
        files[path.name] = path.read_bytes()
    return files


def flat_names(out: pathlib.Path) -> list[str]:
    """The folder's names as releases before versioned datasets laid them out, so that a test can
    say "exactly these files and nothing else" in a few names: the top level's own files (without
    the versions/ history, shards/ and the commit lock), then the files of the current version's
    run folders by their names there (without the sidecars of its shards, which stay by design),
    and "shards/<run>" for every other run folder (an uncommitted leftover). With no manifest (a
    refused run), the newest run folder stands for the current one."""
    out = pathlib.Path(out)
    names = [p.name for p in out.iterdir() if p.name not in ("shards", "versions", ".commit.lock")]
    runs = sorted(p for p in (out / "shards").iterdir()) if (out / "shards").exists() else []
    if (out / "dataset_info.json").exists():
        info = _manifest(out)
        current = {pathlib.PurePosixPath(s["file"]).parent.name for f in info["splits"].values() for s in f["shards"]}
        current.add(pathlib.PurePosixPath(info["dead_letters_file"]).parent.name)
        shards = {pathlib.PurePosixPath(s["file"]).name for f in info["splits"].values() for s in f["shards"]}
    else:
        current = {runs[-1].name} if runs else set()
        shards = {p.name for run in runs[-1:] for p in run.iterdir() if p.name.endswith(".tfrecord")}
    for run in runs:
        if run.name not in current:
            names.append(f"shards/{run.name}")
            continue
        names += [
            p.name
            for p in run.iterdir()
            if not (p.name.startswith(".") and p.name.endswith(".json") and p.name[1:-5] in shards)
        ]
    return sorted(names)


def as_older_release(out: pathlib.Path) -> pathlib.Path:
    """Rearranges a one-version job output, in place, into the flat layout that releases before
    versioned datasets wrote (shards and dead_letters.jsonl beside dataset_info.json, which has no
    version keys; no sidecars, versions/ or shards/): a dataset of such a release, for the tests of
    reading and committing over one. Returns ``out``."""
    out = pathlib.Path(out)
    info = _manifest(out)
    for facts in info["splits"].values():
        for shard in facts["shards"]:
            source = out / shard["file"]
            source.rename(out / source.name)
            shard["file"] = source.name
    (out / info["dead_letters_file"]).rename(out / "dead_letters.jsonl")
    info["dead_letters_file"] = "dead_letters.jsonl"
    flat = {k: v for k, v in info.items() if k not in RUN_KEYS}
    (out / "dataset_info.json").write_text(
        json.dumps(flat, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    for folder in ("shards", "versions"):
        shutil.rmtree(out / folder, ignore_errors=True)
    (out / ".commit.lock").unlink(missing_ok=True)
    return out


def tree_files(folder: pathlib.Path) -> dict[str, bytes]:
    """{path relative to the folder: bytes} of every file in it, at any depth."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

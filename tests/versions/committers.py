"""Real committer processes for the commit tests: racers released together by a barrier, and a
committer that commits in a loop until it is SIGKILLed (``python -m tests.versions.committers``).

A manifest's content is a pure function of its version (``content``), so after any kill the test
can tell a whole manifest from a torn one and the new version from the old.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.versions import history
from beam_jobs.writing import commit
from beam_jobs.writing.commit import VERSION_KEYS, CommitConflictError, commit_version, read_current, version_file

REPO = pathlib.Path(__file__).resolve().parents[2]

__all__ = ["assert_consistent", "content", "kill_committers", "race", "race_for_the_run_lock"]


def content(version: int, *, padding: int = 0, author: str = "") -> dict:
    """The dataset content the committers write as ``version``: large enough (``padding`` bytes)
    that the root write takes a while, and checkable as whole."""
    return {
        "schema_version": 1,
        "label_names": ["cat", "dog"],
        "num_classes": 2,
        "splits": {},
        "seq": version,
        "author": author,
        "padding": "p" * padding,
    }


def _content_of(manifest: dict) -> dict:
    return {key: value for key, value in manifest.items() if key not in VERSION_KEYS}


def assert_consistent(out: str, *, padding: int = 0, since: int = 1, walk: bool = True) -> int:
    """The folder is a whole, consistent history of the loop committer's versions; returns the
    current version. The root parses and is exactly some version v's content, over parent v-1;
    versions/1..v-1 are each exactly their version (those from ``since`` on are read in full: the
    older ones were checked before and nothing rewrites them); versions/v is absent (a kill right
    after the root write) or the root's bytes; nothing above v exists. With ``walk``, the history
    reader walks the same chain (it reads every manifest, so a long loop asks for it sparingly)."""
    store = commit._store(out)  # pylint: disable=protected-access
    current = read_current(out)  # A torn root would not parse: read_current raises.
    version = current.version
    assert version is not None, f"{out}: the root manifest is gone"
    assert _content_of(current.manifest) == content(version, padding=padding), (
        f"root of {out} is not version {version}'s content"
    )
    assert current.manifest["parent_version"] == (version - 1 or None)
    for older in range(max(since, 1), version):
        data, _ = store.read(FileSystems.join(out, version_file(older)))
        assert data is not None, f"{version_file(older)} is missing though version {version} is current"
        manifest = json.loads(data)
        assert manifest["version"] == older and manifest["parent_version"] == (older - 1 or None)
        assert _content_of(manifest) == content(older, padding=padding), f"{version_file(older)} is not whole"
    copy, _ = store.read(FileSystems.join(out, version_file(version)))
    assert copy in (None, current.data), f"{version_file(version)} differs from the root of the same version"
    assert store.read(FileSystems.join(out, version_file(version + 1)))[0] is None
    if walk:
        assert [manifest["version"] for manifest in history(out)] == list(range(version, 0, -1))
    return version


def _set_options(store_flags: Sequence[str]) -> None:
    FileSystems.set_options(PipelineOptions(list(store_flags)))


def _racer(out: str, name: str, rounds: int, store_flags: Sequence[str], barrier, results) -> None:
    _set_options(store_flags)
    for round_number in range(1, rounds + 1):
        barrier.wait()  # Every commit of the round before has ended.
        expected = read_current(out)
        barrier.wait()  # Every racer read the same parent before any of them commits.
        version = (expected.version or 0) + 1
        try:
            commit_version(
                out, content(version, author=name), expected=expected, change={"kind": "overwrite", "run": name}
            )
        except CommitConflictError as error:
            results.put((round_number, name, "conflict", str(error)))
            continue
        except Exception as error:  # pylint: disable=broad-except  # Reported to the test, which fails.
            results.put((round_number, name, "error", f"{type(error).__name__}: {error}"))
            continue
        results.put((round_number, name, "won", ""))


def race(
    out: str, racers: int, rounds: int, *, store_flags: Sequence[str] = ()
) -> dict[int, list[tuple[str, str, str]]]:
    """``racers`` processes that, ``rounds`` times, each read the current version, wait at one
    barrier, then commit over it at once. Returns {round: [(name, "won" | "conflict" | "error",
    message) of each racer]}. The processes live through all rounds: starting one costs seconds."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [
        context.Process(target=_racer, args=(out, f"racer-{i}", rounds, list(store_flags), barrier, results))
        for i in range(racers)
    ]
    for process in processes:
        process.start()
    try:
        outcomes: dict[int, list[tuple[str, str, str]]] = {}
        for _ in range(racers * rounds):
            round_number, *outcome = results.get(timeout=600)
            outcomes.setdefault(round_number, []).append(tuple(outcome))
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return {round_number: sorted(each) for round_number, each in sorted(outcomes.items())}


def _locker(out: str, name: str, store_flags: Sequence[str], barrier, results) -> None:
    from beam_jobs.writing.run_lock import OutputLockedError, acquire_output_lock  # pylint: disable=import-outside-toplevel

    _set_options(store_flags)
    barrier.wait()
    try:
        acquire_output_lock(out)
        results.put((name, "locked", ""))
    except OutputLockedError as error:
        results.put((name, "refused", str(error)))
    barrier.wait()  # The winner stays alive (its lock is not stale) until every racer tried.


def race_for_the_run_lock(out: str, racers: int, *, store_flags: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """``racers`` processes released at once by a barrier, each taking the folder's run lock.
    Returns (name, "locked" | "refused", message) of each."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [
        context.Process(target=_locker, args=(out, f"locker-{i}", list(store_flags), barrier, results))
        for i in range(racers)
    ]
    for process in processes:
        process.start()
    try:
        return sorted(results.get(timeout=600) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


def kill_committers(
    out: str, kills: int, *, padding: int, seed: int, store_flags: Sequence[str] = (), env: dict[str, str] | None = None
) -> dict[str, int]:
    """Starts the loop committer ``kills`` times and SIGKILLs it at a random instant of its second
    commit (uniform over 1.5 times as long as its first one took: on a slow or loaded machine the
    kills still spread over the commit's steps), checking the folder after every kill. Returns
    what the kills left, as counts: a temp root (killed while writing it), a current version
    without its history copy (killed after the root write), or neither."""
    rng = random.Random(seed)
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
    seen: dict[str, int] = {}
    last = 0
    for _ in range(kills):
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.versions.committers", out, "--padding", str(padding), *store_flags],
            cwd=REPO,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            first = process.stdout.readline()  # Blocks until its first commit landed: the loop runs.
            assert first, f"the committer died before committing: {process.stderr.read().decode()[-3000:]}"
            took = float(first.split()[1])
            time.sleep(rng.uniform(0, 1.5 * took))  # Where to kill, not a verdict: nothing waits on time.
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.communicate(timeout=60)
        state = _left_state(out)
        # The history walk after every kill that left the current version without its copy.
        version = assert_consistent(out, padding=padding, since=last, walk=state != "committed whole")
        assert version > last, f"version {version} after a kill; {last} was committed before"
        last = version
        seen[state] = seen.get(state, 0) + 1
    return seen


def _left_state(out: str) -> str:
    if "://" not in out and any(name.startswith(".tmp-") for name in os.listdir(out)):
        return "temp root left"
    store = commit._store(out)  # pylint: disable=protected-access
    if store.read(FileSystems.join(out, version_file(read_current(out).version)))[0] is None:
        return "no history copy of the current version"
    return "committed whole"


def main(argv: Sequence[str] | None = None) -> int:
    """Commits over the current version in a loop, for ever: the test SIGKILLs it at random."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--padding", type=int, default=0)
    arguments, store_flags = parser.parse_known_args(argv)
    _set_options(store_flags)
    name = f"killed-{os.getpid()}"
    while True:
        started = time.monotonic()
        expected = read_current(arguments.out)
        version = (expected.version or 0) + 1
        commit_version(
            arguments.out,
            content(version, padding=arguments.padding),
            expected=expected,
            change={"kind": "overwrite", "run": name},
        )
        print(version, time.monotonic() - started, flush=True)


if __name__ == "__main__":
    sys.exit(main())

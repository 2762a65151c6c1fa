"""A gate that holds a child process's start-up until the test opens it: start-up as slow as a
cold, busy machine's, on demand, with no verdict that depends on how slow it really is.

The child side (``wait_at_gate``) runs at interpreter start (through a ``sitecustomize`` that
``StartupGate.hold_interpreter_start`` installs) or when a decoder's module is imported in the
child (``tests/reliability/gated_decoder.py``). It only ever holds multiprocessing children, never
the test process itself nor multiprocessing's resource tracker.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import sys
import time

__all__ = ["GATE_ENV", "StartupGate", "die_at_start", "wait_at_gate"]

GATE_ENV = "IMAGES_TO_TFRECORDS_TEST_STARTUP_GATE"
_REPO = pathlib.Path(__file__).resolve().parents[2]
_GIVE_UP_S = 900  # A child left behind by a failed test must not wait for ever.


def _is_worker_child() -> bool:
    # At interpreter start multiprocessing is not set up yet; its spawned workers carry this flag.
    return "--multiprocessing-fork" in sys.argv or multiprocessing.parent_process() is not None


def wait_at_gate() -> None:
    """In a multiprocessing child of a test that set GATE_ENV: record arrival, wait for "open"."""
    folder = os.environ.get(GATE_ENV)
    if not folder or not _is_worker_child():
        return
    gate = pathlib.Path(folder)
    (gate / f"arrived-{os.getpid()}").touch()
    give_up = time.monotonic() + _GIVE_UP_S
    while gate.is_dir() and not (gate / "open").exists() and time.monotonic() < give_up:
        time.sleep(0.02)


def die_at_start() -> None:
    """In a multiprocessing child of a test that set GATE_ENV: exit at once, as a crash would."""
    if os.environ.get(GATE_ENV) and _is_worker_child():
        os._exit(70)


class StartupGate:
    """The test's side: open and close the gate, and see which child processes reached it."""

    def __init__(self, folder: pathlib.Path, monkeypatch) -> None:
        self.folder = folder
        self._monkeypatch = monkeypatch
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(GATE_ENV, str(folder))  # Spawned children inherit the environment.

    def hold_interpreter_start(self) -> None:
        """Holds every multiprocessing child before Python has even finished starting."""
        self._at_interpreter_start("wait_at_gate")

    def kill_at_interpreter_start(self) -> None:
        """Makes every multiprocessing child die while Python starts: a worker that cannot start one."""
        self._at_interpreter_start("die_at_start")

    def _at_interpreter_start(self, hook: str) -> None:
        site = self.folder / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(f"from tests.reliability.startup_gate import {hook}\n{hook}()\n")
        path = [str(site), str(_REPO), os.environ.get("PYTHONPATH", "")]
        self._monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))

    def open(self) -> None:
        (self.folder / "open").touch()

    def close(self) -> None:
        (self.folder / "open").unlink(missing_ok=True)

    def arrivals(self) -> set[int]:
        return {int(p.name.split("-", 1)[1]) for p in self.folder.glob("arrived-*")}

    def wait_for_arrival(self, *, besides: frozenset[int] = frozenset(), deadline_s: float = 300) -> int:
        """The pid of a child that reached the gate (other than ``besides``), polling generously."""
        give_up = time.monotonic() + deadline_s
        while time.monotonic() < give_up:
            new = self.arrivals() - besides
            if new:
                return min(new)
            time.sleep(0.05)
        raise AssertionError(f"no child process reached the start-up gate within {deadline_s} s")

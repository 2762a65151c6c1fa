"""The run lock under contention: of runs that find a killed run's lock at once, exactly one
takes it over; the others are told another run holds the folder."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import time

from beam_jobs.writing.run_lock import LOCK_NAME, OutputLockedError, acquire_output_lock


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _contend(folder: str, barrier, outcomes) -> None:
    barrier.wait()  # every contender forked and ready: they start within microseconds of each other
    try:
        acquire_output_lock(folder)
    except OutputLockedError:
        outcomes.put("locked")
    except Exception as error:  # pylint: disable=broad-except  # what the test must see, not hide
        outcomes.put(f"crashed: {type(error).__name__}: {error}")
    else:
        outcomes.put(f"held {os.getpid()}")
        time.sleep(0.2)  # converting; never released, as a long run's lock is not until it ends


def test_several_runs_finding_one_stale_lock_leave_exactly_one_holder(tmp_path):
    context = multiprocessing.get_context("fork")
    for trial in range(30):
        folder = tmp_path / f"out{trial}"
        folder.mkdir()
        stale = {"host": socket.gethostname(), "pid": _dead_pid(), "started": "then"}
        (folder / LOCK_NAME).write_text(json.dumps(stale))
        barrier, outcomes = context.Barrier(4), context.Queue()
        contenders = [context.Process(target=_contend, args=(str(folder), barrier, outcomes)) for _ in range(4)]
        for contender in contenders:
            contender.start()
        results = sorted(outcomes.get(timeout=60) for _ in contenders)
        for contender in contenders:
            contender.join(timeout=60)
        assert len([r for r in results if r.startswith("held")]) == 1 and results.count("locked") == 3, (trial, results)
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] != stale["pid"]
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # no takeover file left behind

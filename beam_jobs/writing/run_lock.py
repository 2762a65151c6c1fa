"""One run at a time per output folder: a lock file naming the run that holds it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs.errors import JobError
from beam_jobs.storage import delete_exactly, write_atomically
from beam_jobs.writing.commit import create_if_absent

__all__ = ["LOCK_NAME", "OutputLockedError", "acquire_output_lock", "release_output_lock"]

LOCK_NAME = ".images-to-tfrecords.lock"


class OutputLockedError(JobError):
    """Another run is writing into the same output folder."""


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _read(path: str) -> dict:
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            holder = json.loads(handle.read().decode("utf-8"))
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _is_stale(holder: dict) -> bool:
    """A lock left by a killed run on this host (its process is gone) can be taken over, on a local
    disk or an object store alike."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire_output_lock(output_dir: str) -> str:
    """Takes the folder's lock or raises OutputLockedError naming the run that holds it.

    Two runs into one folder would overwrite each other's staged shards and each commit a
    dataset the other then replaces. On local disks the lock is created atomically (O_EXCL); on
    gs:// and s3:// with one conditional create (Beam's API has none); on other filesystems it is
    checked and then written, which narrows the race to the moment both runs start.
    """
    path = FileSystems.join(output_dir, LOCK_NAME)
    data = json.dumps(_holder()).encode("utf-8")
    if "://" not in path:
        for _ in range(40):  # a stale lock's takeover: one run at a time (about 2 s of waiting at most)
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read(path)
                if not holder and not os.path.exists(path):
                    continue  # released (or taken away) between the create and the read
                if _is_stale(holder):
                    _take_away_stale_lock(path, holder)
                    continue
                raise _locked(output_dir, path, holder) from None
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
            return path
        raise _locked(output_dir, path, _read(path))
    for _ in range(2):
        if FileSystems.exists(path):
            holder = _read(path)
            if _is_stale(holder):  # A run killed on this host; --resume after a kill must not stop here.
                delete_exactly([path])
                continue
            raise _locked(output_dir, path, holder)
        if path.split("://", 1)[0].lower() in ("gs", "s3"):
            # One conditional create (beam_jobs/writing/commit.py): of two runs starting at once, one wins.
            if not create_if_absent(path, data):
                raise _locked(output_dir, path, _read(path))
        else:
            write_atomically(path, data)
        return path
    raise _locked(output_dir, path, _read(path))


def _take_away_stale_lock(path: str, stale: dict) -> None:
    """Removes the lock file at ``path`` only while it is still the stale one read (``stale``).

    Of several runs that find one stale lock at once, each would otherwise remove whatever lock
    file is there by then, the new one another run just created included, and two runs would
    hold the folder. So the takeover has a lock of its own, created atomically beside it: only
    its holder reads the lock again and removes it, and a fresh lock cannot appear meanwhile (its
    atomic create fails while the stale file is there). The others wait a moment and look again.
    A takeover lock left by a process killed inside these few lines is stale in turn."""
    guard = path + ".takeover"
    try:
        descriptor = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if _is_stale(_read(guard)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(guard)
        else:
            time.sleep(0.05)
        return
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(json.dumps(_holder()).encode("utf-8"))
        if _read(path) == stale:
            os.remove(path)
    finally:
        os.remove(guard)


def _locked(output_dir: str, path: str, holder: dict) -> OutputLockedError:
    who = (
        f"process {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
        if holder
        else "another run"
    )
    return OutputLockedError(
        f"another run ({who}) is writing into {output_dir}; wait for it to finish, or, if no run is "
        f"(it was killed on another machine), remove {path}"
    )


def release_output_lock(path: str) -> None:
    """Removes the run's lock file so that the next run may write; never fails the run that is ending."""
    try:
        delete_exactly([path])
    except Exception:  # Best effort: a leftover lock of a dead process on this host is taken over.
        pass

"""One run at a time per output folder: a lock file naming the run that holds it."""

from __future__ import annotations

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
        for _ in range(2):
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read(path)
                if _is_stale(holder):
                    os.remove(path)
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

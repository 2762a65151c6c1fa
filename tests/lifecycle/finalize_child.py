"""A run's last step alone, in its own process: finalize_outputs over a run folder whose shards are
complete, as the job's WriteManifest step calls it. The test kills this process (SIGKILL) at
random instants between "go" and "done", which covers the dead letters' write, the commit, and the
clean-up and garbage collection after it, without paying for a whole conversion per kill.

Usage: python -m tests.lifecycle.finalize_child ARGS.json; prints "ready", waits for a line on
stdin, prints "done" when finalize_outputs has returned.
"""

from __future__ import annotations

import json
import sys

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.config import ImageConfig
from beam_jobs.records import ShardResult
from beam_jobs.writing.commit import read_current
from beam_jobs.writing.finalize import finalize_outputs


def main(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        args = json.load(handle)
    FileSystems.set_options(PipelineOptions(args.get("beam_flags", [])))
    results = [
        ShardResult(**{**r, "class_counts": tuple(map(tuple, r["class_counts"])), "dead_letters_by_reason": ()})
        for r in args["results"]
    ]
    expected = read_current(args["output_dir"])  # as run() reads it, before the pipeline starts
    print("ready", flush=True)
    sys.stdin.readline()
    finalize_outputs(
        results,
        args["summary"],
        [],
        [],
        output_dir=args["output_dir"],
        run=args["run"],
        expected=expected,
        change_kind="overwrite",
        config=ImageConfig(**args["image"]),
        settings=args["settings"],
        max_bad_fraction=0.01,
        keep_versions=2,
    )
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

"""A PipelineRunner that runs nothing: it saves the pipeline proto (every DoFn pickled with Beam's
default pickler, as any remote runner would) for a fresh process to unpickle."""

from __future__ import annotations

import os

from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

PROTO_PATH_ENV = "CAPTURE_RUNNER_PROTO"


class CaptureRunner(PipelineRunner):
    def run_pipeline(self, pipeline, options):
        proto = pipeline.to_runner_api()
        with open(os.environ[PROTO_PATH_ENV], "wb") as handle:
            handle.write(proto.SerializeToString())
        return PipelineResult(PipelineState.DONE)

"""Where to watch a job that runs elsewhere: the Flink, Spark or Dataflow UI shows its stages."""

from __future__ import annotations

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SparkRunnerOptions,
    StandardOptions,
)

__all__ = ["watch_hint"]


def _runner_name(options: PipelineOptions) -> str:
    runner = options.view_as(StandardOptions).runner or ""
    return (runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1].lower()


def watch_hint(options: PipelineOptions, job_id: str | None = None) -> str | None:
    """One line naming the UI of a cluster runner (None for the local runner, which has none).

    The job's counters (images_read, images_written, failed_<reason>, ...) reach these UIs as
    Beam metrics; the progress shown on the console comes from the output folder instead, and
    only when this machine can read it.
    """
    name = _runner_name(options)
    if name in ("", "fnapirunner", "directrunner", "direct", "fnapi"):
        return None
    if name.startswith("flink"):
        master = options.view_as(FlinkRunnerOptions).flink_master
        if master in (None, "[auto]", "[local]"):
            return "running on an embedded Flink cluster (no web UI); its counters are logged at the end"
        address = master if "://" in master else f"http://{master}"
        return f"watch the job in the Flink web UI: {address}/#/job/running (stages, records, the job's counters)"
    if name.startswith("spark"):
        master = options.view_as(SparkRunnerOptions).spark_master_url
        if not master.startswith("spark://"):
            return f"running on Spark ({master}); its counters are logged at the end"
        host = master.removeprefix("spark://").rsplit(":", 1)[0]
        return (
            f"watch the job in the web UI of the Spark Master on {host} (its stages and executors; port 8080 "
            "by default, launch/spark_cluster.sh status names it)"
        )
    if name.startswith("dataflow"):
        cloud = options.view_as(GoogleCloudOptions)
        if job_id:
            return (
                f"watch the job in the Dataflow console: https://console.cloud.google.com/dataflow/jobs/"
                f"{cloud.region}/{job_id}?project={cloud.project}"
            )
        return f"watch the job in the Dataflow console: https://console.cloud.google.com/dataflow/jobs?project={cloud.project}"
    endpoint = options.view_as(PortableOptions).job_endpoint
    where = f" (job service {endpoint})" if endpoint else ""
    return f"running on {options.view_as(StandardOptions).runner}{where}: its own UI or logs show the stages"

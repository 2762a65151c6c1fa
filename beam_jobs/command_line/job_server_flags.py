"""The options of Beam's Java job servers (Flink's, Spark's), which their runners take from the
command line beside Beam Python's own.

Beam's portable runner asks the job server for its runner's options when it submits a job
(DescribePipelineOptions) and parses them from the same command line, so a Beam pipeline takes
``--max_bundle_size 1000`` or ``--checkpointing_interval 60000`` with FlinkRunner and
``--storage_level`` with SparkRunner. The job's command line refuses a flag it does not know
before anything starts (a misspelt ``--image-size`` must not run with the defaults), and has no
job server to ask then, so it keeps their names: a copy of what the job servers that launch/
builds describe (Beam's Java runners 2.62.0, launch/flink_job_server and launch/spark_job_server).
A test compares each copy with what its real job server describes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

__all__ = [
    "FLINK_JOB_SERVER_OPTION_STRINGS",
    "JOB_SERVER_RUNNER_VERSION",
    "SPARK_JOB_SERVER_OPTION_STRINGS",
    "job_server_option_strings",
    "other_runners_flag",
    "quiet_beams_warning_for",
    "refused_runner_option",
]

JOB_SERVER_RUNNER_VERSION = "2.62.0"
FLINK_JOB_SERVER_OPTION_STRINGS = frozenset(
    {
        "--allow_non_restored_state",
        "--app_name",
        "--attached_mode",
        "--auto_balance_write_files_sharding_enabled",
        "--auto_watermark_interval",
        "--bundle_processor_cache_timeout",
        "--checkpoint_timeout_millis",
        "--checkpointing_interval",
        "--checkpointing_mode",
        "--credential_factory_class",
        "--default_environment_config",
        "--default_environment_type",
        "--disable_metrics",
        "--enable_heap_dumps",
        "--enable_stable_input_drain",
        "--environment_expiration_millis",
        "--execution_mode_for_batch",
        "--execution_retry_delay",
        "--executor_service",
        "--externalized_checkpoints_enabled",
        "--fail_on_checkpointing_errors",
        "--faster_copy",
        "--file_input_split_max_size_m_b",
        "--finish_bundle_before_checkpointing",
        "--flink_conf_dir",
        "--force_unaligned_checkpoint_enabled",
        "--g_c_thrashing_percentage_per_period",
        "--gcp_credential",
        "--gcp_temp_location",
        "--gcs_endpoint",
        "--gcs_http_request_read_timeout",
        "--gcs_http_request_write_timeout",
        "--gcs_performance_metrics",
        "--gcs_read_counter_prefix",
        "--gcs_rewrite_data_op_batch_limit",
        "--gcs_upload_buffer_size_bytes",
        "--gcs_util",
        "--gcs_write_counter_prefix",
        "--google_api_trace",
        "--google_cloud_storage_read_options",
        "--grouping_table_max_size_mb",
        "--jdk_add_open_modules",
        "--job_check_interval_in_secs",
        "--latency_tracking_interval",
        "--load_balance_bundles",
        "--log_mdc",
        "--max_bundle_size",
        "--max_bundle_time_mills",
        "--max_cache_memory_usage_mb_class",
        "--max_cache_memory_usage_percent",
        "--min_pause_between_checkpoints",
        "--num_concurrent_checkpoints",
        "--number_of_execution_retries",
        "--object_reuse",
        "--operator_chaining",
        "--options_id",
        "--path_validator",
        "--path_validator_class",
        "--re_iterable_group_by_key_result",
        "--report_checkpoint_duration",
        "--retain_docker_containers",
        "--retain_externalized_checkpoints_on_cancellation",
        "--savepoint_path",
        "--semi_persist_dir",
        "--shutdown_sources_after_idle_ms",
        "--stable_unique_names",
        "--state_backend",
        "--state_backend_factory",
        "--state_backend_storage_path",
        "--transform_service_address",
        "--transform_service_beam_version",
        "--transforms_to_override",
        "--unaligned_checkpoint_enabled",
        "--use_data_stream_for_batch",
    }
)
SPARK_JOB_SERVER_OPTION_STRINGS = frozenset(
    {
        "--app_name",
        "--batch_interval_millis",
        "--block_on_run",
        "--bundle_processor_cache_timeout",
        "--bundle_size",
        "--cache_disabled",
        "--checkpoint_dir",
        "--checkpoint_duration_millis",
        "--credential_factory_class",
        "--default_environment_config",
        "--default_environment_type",
        "--enable_heap_dumps",
        "--enable_spark_metric_sinks",
        "--enforce_encodability",
        "--enforce_immutability",
        "--environment_expiration_millis",
        "--executor_service",
        "--g_c_thrashing_percentage_per_period",
        "--gcp_credential",
        "--gcp_temp_location",
        "--gcs_endpoint",
        "--gcs_http_request_read_timeout",
        "--gcs_http_request_write_timeout",
        "--gcs_performance_metrics",
        "--gcs_read_counter_prefix",
        "--gcs_rewrite_data_op_batch_limit",
        "--gcs_upload_buffer_size_bytes",
        "--gcs_util",
        "--gcs_write_counter_prefix",
        "--google_api_trace",
        "--google_cloud_storage_read_options",
        "--grouping_table_max_size_mb",
        "--jdk_add_open_modules",
        "--load_balance_bundles",
        "--log_mdc",
        "--max_cache_memory_usage_mb_class",
        "--max_cache_memory_usage_percent",
        "--max_records_per_batch",
        "--min_read_time_millis",
        "--options_id",
        "--path_validator",
        "--path_validator_class",
        "--read_time_percentage",
        "--retain_docker_containers",
        "--runner_determined_sharding",
        "--semi_persist_dir",
        "--spark_master",
        "--stable_unique_names",
        "--storage_level",
        "--streaming_timeout_ms",
        "--target_parallelism",
        "--test_mode",
        "--transform_service_address",
        "--transform_service_beam_version",
        "--transforms_to_override",
        "--use_active_spark_session",
        "--uses_provided_spark_context",
    }
)
# Options the job servers take that this job refuses, and why.
_REFUSED = {
    # Measured on a 1-TaskManager Flink cluster: the job hung in its fourth stage and never ended.
    # With it, each bundle holds one of the --sdk_worker_parallelism SDK workers while it runs, and
    # the stages that Flink runs at once in a batch job outnumber them.
    "--load_balance_bundles": "it hung this job on Flink (each bundle then holds one of the SDK workers while it runs, "
    "and the job runs more stages at once than there are workers)",
}
# (the runner's name as --runner takes it, its launch script) for each job server's options.
_RUNNERS = {
    "flink": ("FlinkRunner", "launch/submit_flink.sh", FLINK_JOB_SERVER_OPTION_STRINGS),
    "spark": ("SparkRunner", "launch/submit_spark.sh", SPARK_JOB_SERVER_OPTION_STRINGS),
}


def _runner_key(argv: Sequence[str]) -> str | None:
    """The runner ``argv`` names (its last --runner), as Beam looks it up: by the class's name, in
    any case, with or without its module and its "Runner" ending ("flink", "FlinkRunner")."""
    runner = None
    for index, token in enumerate(argv):
        if token == "--":
            break
        if token.startswith("--runner="):
            runner = token.split("=", 1)[1]
        elif token == "--runner" and index + 1 < len(argv):
            runner = argv[index + 1]
    if runner is None:
        return None
    name = runner.rsplit(".", 1)[-1].lower()
    return name.removesuffix("runner")


def job_server_option_strings(argv: Sequence[str]) -> frozenset[str]:
    """The job server's options that the runner ``argv`` names takes (FlinkRunner's, SparkRunner's);
    none for any other runner."""
    entry = _RUNNERS.get(_runner_key(argv) or "")
    return entry[2] if entry else frozenset()


def other_runners_flag(flag: str, argv: Sequence[str]) -> str | None:
    """The error for ``flag`` (a name, without its value) when it is an option of another runner's
    job server than the one ``argv`` names (``--max_bundle_size`` with the local runner), else None."""
    if flag in job_server_option_strings(argv):
        return None
    takers = [(runner, script) for runner, script, options in _RUNNERS.values() if flag in options]
    if not takers:
        return None
    named = " and ".join(runner for runner, _ in takers)
    how = " or ".join(f"--runner {runner} ({script})" for runner, script in takers)
    return f"{flag} is an option of {named}, which its job server describes: it applies with {how}"


def refused_runner_option(argv: Sequence[str]) -> str | None:
    """The error for the first job server option in ``argv`` that this job refuses, or None."""
    for token in argv:
        if token == "--":
            return None
        name = token.split("=", 1)[0]
        if name in _REFUSED:
            return f"{name} is refused: {_REFUSED[name]}"
    return None


class _PassedThrough(logging.Filter):
    """Drops Beam's warnings about unknown arguments when they name only ``arguments``: its
    "Unparseable argument: X" (a pipeline's start) and "Discarding unparseable args: [...]"."""

    def __init__(self) -> None:
        super().__init__()
        self.arguments: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_UNPARSEABLE):
            return message.removeprefix(_UNPARSEABLE).split(". Did you mean", 1)[0] not in self.arguments
        if message.startswith(_DISCARDING) and isinstance(record.args, tuple) and len(record.args) == 1:
            named = record.args[0]
            return not (isinstance(named, list) and set(named) <= self.arguments)
        return True


_UNPARSEABLE = "Unparseable argument: "
_DISCARDING = "Discarding unparseable args: "
_PASSED_THROUGH = _PassedThrough()


def quiet_beams_warning_for(arguments: Iterable[str]) -> None:
    """Beam's PipelineOptions warns "Unparseable argument" on the console for each of a job
    server's options and their values (it learns of them only when its runner asks the job server
    at submission, and then parses them): for those the job's checks let through, that warning
    says nothing true, so it is dropped, in this process (the driver)."""
    _PASSED_THROUGH.arguments.update(arguments)
    logger = logging.getLogger("apache_beam.options.pipeline_options")
    if _PASSED_THROUGH not in logger.filters:
        logger.addFilter(_PASSED_THROUGH)

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
    "quiet_warnings_apply",
    "runner_ambiguous",
    "runner_option_error",
    "switch_arguments",
]

JOB_SERVER_RUNNER_VERSION = "2.62.0"


def _by_kind(**kinds: set[str]) -> dict[str, str]:
    """{option: its kind} from the options of each kind: "on" (a switch that turns it on), "off"
    (a switch that turns off what is on by default: Beam's runner adds it so, "store_false"),
    "int", "number", "list" (given once per value), "text"."""
    return {option: kind for kind, options in kinds.items() for option in options}


# Both job servers' (Beam's portable and Java SDK options, which both register).
_BOTH = _by_kind(
    on={
        "--enable_heap_dumps",
        "--gcs_performance_metrics",
        "--load_balance_bundles",
        "--retain_docker_containers",
    },
    off={
        "--log_mdc",
    },
    int={
        "--environment_expiration_millis",
        "--gcs_http_request_read_timeout",
        "--gcs_http_request_write_timeout",
        "--gcs_rewrite_data_op_batch_limit",
        "--gcs_upload_buffer_size_bytes",
        "--grouping_table_max_size_mb",
        "--options_id",
    },
    number={
        "--g_c_thrashing_percentage_per_period",
        "--max_cache_memory_usage_percent",
    },
    list={
        "--jdk_add_open_modules",
        "--transforms_to_override",
    },
    text={
        "--app_name",
        "--bundle_processor_cache_timeout",
        "--credential_factory_class",
        "--default_environment_config",
        "--default_environment_type",
        "--executor_service",
        "--gcp_credential",
        "--gcp_temp_location",
        "--gcs_endpoint",
        "--gcs_read_counter_prefix",
        "--gcs_util",
        "--gcs_write_counter_prefix",
        "--google_api_trace",
        "--google_cloud_storage_read_options",
        "--max_cache_memory_usage_mb_class",
        "--path_validator",
        "--path_validator_class",
        "--semi_persist_dir",
        "--stable_unique_names",
        "--transform_service_address",
        "--transform_service_beam_version",
    },
)
# FlinkPipelineOptions.
FLINK_JOB_SERVER_OPTIONS = _BOTH | _by_kind(
    on={
        "--allow_non_restored_state",
        "--auto_balance_write_files_sharding_enabled",
        "--disable_metrics",
        "--enable_stable_input_drain",
        "--externalized_checkpoints_enabled",
        "--faster_copy",
        "--finish_bundle_before_checkpointing",
        "--force_unaligned_checkpoint_enabled",
        "--object_reuse",
        "--re_iterable_group_by_key_result",
        "--retain_externalized_checkpoints_on_cancellation",
        "--unaligned_checkpoint_enabled",
        "--use_data_stream_for_batch",
    },
    off={
        "--attached_mode",
        "--fail_on_checkpointing_errors",
        "--operator_chaining",
    },
    int={
        "--auto_watermark_interval",
        "--checkpoint_timeout_millis",
        "--checkpointing_interval",
        "--execution_retry_delay",
        "--file_input_split_max_size_m_b",
        "--job_check_interval_in_secs",
        "--latency_tracking_interval",
        "--max_bundle_size",
        "--max_bundle_time_mills",
        "--min_pause_between_checkpoints",
        "--num_concurrent_checkpoints",
        "--number_of_execution_retries",
        "--shutdown_sources_after_idle_ms",
    },
    text={
        "--checkpointing_mode",
        "--execution_mode_for_batch",
        "--flink_conf_dir",
        "--report_checkpoint_duration",
        "--savepoint_path",
        "--state_backend",
        "--state_backend_factory",
        "--state_backend_storage_path",
    },
)
# SparkPipelineOptions.
SPARK_JOB_SERVER_OPTIONS = _BOTH | _by_kind(
    on={
        "--cache_disabled",
        "--test_mode",
        "--use_active_spark_session",
        "--uses_provided_spark_context",
    },
    off={
        "--block_on_run",
        "--enable_spark_metric_sinks",
        "--enforce_encodability",
        "--enforce_immutability",
        "--runner_determined_sharding",
    },
    int={
        "--batch_interval_millis",
        "--bundle_size",
        "--checkpoint_duration_millis",
        "--max_records_per_batch",
        "--min_read_time_millis",
        "--streaming_timeout_ms",
        "--target_parallelism",
    },
    number={
        "--read_time_percentage",
    },
    text={
        "--checkpoint_dir",
        "--spark_master",
        "--storage_level",
    },
)
FLINK_JOB_SERVER_OPTION_STRINGS = frozenset(FLINK_JOB_SERVER_OPTIONS)
SPARK_JOB_SERVER_OPTION_STRINGS = frozenset(SPARK_JOB_SERVER_OPTIONS)

# Options the job servers take that this job refuses, and why.
_REFUSED = {
    # Measured on a 1-TaskManager Flink cluster: the job hung in its fourth stage and never ended.
    # With it, each bundle holds one of the --sdk_worker_parallelism SDK workers while it runs, and
    # the stages that Flink runs at once in a batch job outnumber them.
    "--load_balance_bundles": "it hung this job on Flink (each bundle then holds one of the SDK workers while it runs, "
    "and the job runs more stages at once than there are workers)",
}
# (the runner's name as --runner takes it, its launch script, its job server's options) by runner.
_RUNNERS = {
    "flink": ("FlinkRunner", "launch/submit_flink.sh", FLINK_JOB_SERVER_OPTIONS),
    "spark": ("SparkRunner", "launch/submit_spark.sh", SPARK_JOB_SERVER_OPTIONS),
}


def _runners_named(argv: Sequence[str]) -> list[str]:
    """Every --runner value in ``argv`` (before a ``--``)."""
    named = []
    for index, token in enumerate(argv):
        if token == "--":
            break
        if token.startswith("--runner="):
            named.append(token.split("=", 1)[1])
        elif token == "--runner":
            named.append(argv[index + 1] if index + 1 < len(argv) else "")
    return named


def runner_ambiguous(argv: Sequence[str]) -> bool:
    """Whether ``argv`` names its runner more than once or as a blank: the full parse refuses that
    (its own message), and no runner's options are taken meanwhile."""
    named = _runners_named(argv)
    return len(named) > 1 or any(not name.strip() for name in named)


def _runner_key(argv: Sequence[str]) -> str | None:
    """The runner ``argv`` names, as Beam looks it up: by the class's name, in any case, with or
    without its module and its "Runner" ending ("flink", "FlinkRunner"); None when none is named,
    or it is named twice or blank."""
    named = _runners_named(argv)
    if not named or runner_ambiguous(argv):
        return None
    return named[0].rsplit(".", 1)[-1].lower().removesuffix("runner")


def _options_taken(argv: Sequence[str]) -> dict[str, str]:
    """{option: kind} of the job server options the runner ``argv`` names takes: FlinkRunner's,
    SparkRunner's, or with PortableRunner (a job server of either kind at --job_endpoint) both's."""
    key = _runner_key(argv)
    if key == "portable":
        return {**SPARK_JOB_SERVER_OPTIONS, **FLINK_JOB_SERVER_OPTIONS}
    entry = _RUNNERS.get(key or "")
    return dict(entry[2]) if entry else {}


def job_server_option_strings(argv: Sequence[str]) -> frozenset[str]:
    """The job server's options that the runner ``argv`` names takes (FlinkRunner's, SparkRunner's,
    PortableRunner's); none for any other runner."""
    return frozenset(_options_taken(argv))


def quiet_warnings_apply(argv: Sequence[str]) -> bool:
    """Whether Beam's warnings about the options passed through say nothing true: with FlinkRunner
    and SparkRunner their job servers take every one; with PortableRunner a job server of the
    other kind drops those it does not know, and Beam's warning is then the only word of it."""
    return _runner_key(argv) in _RUNNERS


def other_runners_flag(flag: str, argv: Sequence[str]) -> str | None:
    """The error for ``flag`` (a name, without its value) when it is an option of another runner's
    job server than the one ``argv`` names (``--max_bundle_size`` with the local runner), else None."""
    if flag in _options_taken(argv) or runner_ambiguous(argv):
        return None
    takers = [(runner, script) for runner, script, options in _RUNNERS.values() if flag in options]
    if not takers:
        return None
    named = " and ".join(runner for runner, _ in takers)
    how = " or ".join(f"--runner {runner} ({script})" for runner, script in takers)
    return f"{flag} is an option of {named}, which its job server describes: it applies with {how}"


def runner_option_error(argv: Sequence[str]) -> str | None:
    """The error for the first job server option in ``argv`` given as Beam's runner would misread
    it, or None. Beam parses them only at submission, after the job's own checks (a bad value then
    ends the run with Beam's whole usage text), and it drops a switch's value without a word:
    ``--object_reuse false`` turns object reuse on, ``--operator_chaining true`` turns chaining
    off. So here a switch takes no value, any other option one (a whole number where the job
    server says so), each once unless it is a list."""
    refused = _refused_runner_option(argv)
    if refused:
        return refused
    taken = _options_taken(argv)
    seen: set[str] = set()
    for index, token in enumerate(argv):
        if token == "--":
            return None
        name, has_value, value = token.partition("=")
        kind = taken.get(name)
        if kind is None:
            continue
        if name in seen and kind != "list":
            return f"{name} is given more than once; give it once"
        seen.add(name)
        following = argv[index + 1] if index + 1 < len(argv) else None
        if kind in ("on", "off"):
            if has_value or (following is not None and not following.startswith("-")):
                effect = "turns it on" if kind == "on" else "turns off what is on by default"
                return f"{name} is a switch that takes no value: giving it {effect}, and Beam drops any value"
            continue
        if not has_value:
            if following is None or following.startswith("--"):
                return f"{name} needs a value"
            value = following
        if kind == "int" and not value.strip().lstrip("-").isdigit():
            return f"{name} takes a whole number (got {value!r})"
        if kind == "number":
            try:
                float(value)
            except ValueError:
                return f"{name} takes a number (got {value!r})"
    return None


def _refused_runner_option(argv: Sequence[str]) -> str | None:
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


def switch_arguments(name: str, value: bool) -> list[str] | None:
    """A job server switch given as a keyword (``beam_options={"operator_chaining": False}``) as
    the command line gives it, or None when ``name`` is no such switch. A switch that is on by
    default is turned off by giving it (Beam's runner adds it as "store_false"): False gives it,
    True leaves it off the line."""
    flag = f"--{name}"
    kind = FLINK_JOB_SERVER_OPTIONS.get(flag) or SPARK_JOB_SERVER_OPTIONS.get(flag)
    if kind not in ("on", "off"):
        return None
    return [flag] if value == (kind == "on") else []

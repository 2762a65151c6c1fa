#!/usr/bin/env bash
# Submits the images-to-tfrecords job to a Spark standalone cluster with Beam's portable SparkRunner.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"
# shellcheck source=launch/_spark.sh
source "$ITT_REPO_ROOT/launch/_spark.sh"

usage() {
  cat <<EOF
Usage: launch/submit_spark.sh [options] [--] JOB_ARGS...

Runs \`python -m beam_jobs --runner=SparkRunner ... JOB_ARGS\`. The defaults work against
launch/spark_cluster.sh start. Every argument this script does not know is passed to the job,
e.g. --input DIR --output_dir DIR --image_size 224 --num_shards 16.

Options (defaults in brackets):
  --spark_master HOST:PORT     the Spark Master (spark://HOST:PORT) [127.0.0.1:7077]
  --environment_type T         where the Python SDK workers run [EXTERNAL]:
                                 EXTERNAL  a worker pool already running next to each Worker
                                           (spark_cluster.sh starts one); --environment_config
                                           is its HOST:PORT [127.0.0.1:50001]
                                 DOCKER    a container per worker, from --sdk_image
                                 PROCESS   a command on each Worker host; --environment_config
                                           is JSON, e.g. '{"command": "/opt/apache/beam/boot"}'
  --environment_config C       see above
  --sdk_image IMAGE            DOCKER only [apache/beam_pythonX.Y_sdk:<beam version>]
  --spark_version V            Spark release of the cluster [$ITT_SPARK_VERSION_DEFAULT]: the job server
                               started for a job is built with the same Spark
  --beam_runner_version V      Beam Java runner release the job server is built from [$ITT_SPARK_BEAM_RUNNER_VERSION_DEFAULT]
  --job_endpoint HOST:PORT     a running Beam Spark job server for --spark_master [the one that
                               spark_cluster.sh start keeps for that cluster, else one started
                               for this job from the jar below]
  --spark_job_server_jar JAR   Beam's Spark job server jar, started for this job
                               [\$SPARK_JOB_SERVER_JAR, else built once into the cache from
                               launch/spark_job_server/pom.xml]
  --job_module M               Python module to run [beam_jobs]
  --dry-run                    check the job's arguments with its own parser, print the
                               command and exit; contacts nothing and builds nothing
  -h, --help                   this help

Python: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3.
The job server translates the job into Spark stages and runs the job's Spark driver in its own
JVM. A cluster that spark_cluster.sh started keeps one running, which this script uses;
otherwise (or with a jar given) it is a Java process that this script starts for the job and
stops after it, its output in \$(cache)/logs/spark-job-server-<time>-<pid>.log.
Interrupted (Ctrl-C, SIGTERM), it cancels its own job through the job server.
Watch the job in the Master's web UI (http://127.0.0.1:8080 for spark_cluster.sh's defaults).
EOF
}

spark_master=127.0.0.1:7077
environment_type=EXTERNAL
environment_config=""
sdk_image=""
spark_version=$ITT_SPARK_VERSION_DEFAULT
beam_runner_version=$ITT_SPARK_BEAM_RUNNER_VERSION_DEFAULT
job_server_jar=""
job_endpoint=""
cmd_tail=()
# The job's name at the job server: how an interrupt cancels this script's job and no other.
# A --job_name among the job's arguments wins.
job_name="images-to-tfrecords-$(date -u +%Y%m%dT%H%M%SZ)-$$"
job_module=beam_jobs
dry_run=0
job_args=()
while (($#)); do
  case "$1" in
    --spark_master|--environment_type|--environment_config|--sdk_image|--spark_version|--beam_runner_version \
      |--job_endpoint|--spark_job_server_jar|--job_module)
      itt_need_value "$@"; set -- "$1=$2" "${@:3}" ;;
    --spark_master=*) spark_master=${1#*=}; shift ;;
    --environment_type=*) environment_type=${1#*=}; shift ;;
    --environment_config=*) environment_config=${1#*=}; shift ;;
    --sdk_image=*) sdk_image=${1#*=}; shift ;;
    --spark_version=*) spark_version=${1#*=}; shift ;;
    --beam_runner_version=*) beam_runner_version=${1#*=}; shift ;;
    --job_endpoint=*) job_endpoint=${1#*=}; shift ;;
    --spark_job_server_jar=*) job_server_jar=${1#*=}; shift ;;
    --job_module=*) job_module=${1#*=}; shift ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; job_args+=("$@"); break ;;
    *) job_args+=("$1"); shift ;;
  esac
done

spark_master=${spark_master#spark://}
[[ "$spark_master" =~ ^[^:/]+:[0-9]+$ ]] || itt_die "--spark_master must be HOST:PORT (got '$spark_master')"
[[ -z "$job_endpoint" || "$job_endpoint" =~ ^[^:/]+:[0-9]+$ ]] \
  || itt_die "--job_endpoint must be HOST:PORT (got '$job_endpoint')"
[[ "$spark_version" =~ ^3\.[0-9]+\.[0-9]+$ ]] \
  || itt_die "--spark_version must be a Spark 3 release X.Y.Z (got '$spark_version'; Beam's runner is built for Spark 3)"
for ((i = 0; i < ${#job_args[@]}; i++)); do
  case "${job_args[i]}" in
    --job_name=*) job_name=${job_args[i]#*=} ;;
    --job_name) job_name=${job_args[i + 1]:-$job_name} ;;
  esac
done
if [[ -n "$job_server_jar" ]]; then
  itt_need_jar --spark_job_server_jar "$job_server_jar"
elif [[ -n "${SPARK_JOB_SERVER_JAR:-}" ]]; then
  itt_need_jar SPARK_JOB_SERVER_JAR "$SPARK_JOB_SERVER_JAR"
fi

py=$(itt_python)
environment_config=$(itt_environment_config "$environment_type" "$environment_config" 127.0.0.1:50001 "$sdk_image") || exit 2

# The job server that spark_cluster.sh keeps for this cluster, unless a jar or an endpoint is given.
# It runs one job at a time: Spark allows one context per JVM, and a second job failed at once with
# "Only one SparkContext should be running in this JVM". So a submit holds the record's lock while
# its job runs, and one that finds it held starts a job server of its own (Spark then queues the
# two applications). A job submitted to that job server by other means is not seen.
record=$(itt_job_server_record "$spark_master" spark-)
webui=""
[[ ! -f "$record" ]] || read -r _ _ webui _ <"$record" || true
if [[ -z "$job_endpoint" && -z "$job_server_jar" ]]; then
  if found=$(itt_cluster_job_endpoint "$spark_master" "$ITT_SPARK_JOB_SERVER_MAIN" spark-); then
    if (( dry_run )); then
      job_endpoint=$found
    elif exec {cluster_lock}>>"$record.lock" && flock -n "$cluster_lock"; then
      job_endpoint=$found  # the lock is held until this script exits, with its job
    else
      itt_log "the cluster's job server ($found) is running another job, and runs one at a time: starting one for this job"
    fi
  elif [[ -e "$record" ]] && (( ! dry_run )); then
    itt_log "the job server that spark_cluster.sh started for $spark_master is not running (spark_cluster.sh status says so; stop and start the cluster to have it back): starting one for this job"
  fi
elif [[ -n "$job_endpoint" ]] && (( ! dry_run )); then
  itt_need_job_service "$job_endpoint" "start the cluster's job server (launch/spark_cluster.sh start)"
fi
if (( ! dry_run )); then
  # A Master that is not there fails much later inside the job server, as a Java stack trace.
  itt_port_open "${spark_master%:*}" "${spark_master##*:}" \
    || itt_die "no Spark Master answers at spark://$spark_master: start a cluster (launch/spark_cluster.sh start) or pass --spark_master HOST:PORT"
  # So does a worker pool that is not there (each task fails 4 times, "Connection refused" deep in
  # the trace); one on this machine can be checked from here.
  if [[ "$environment_type" == EXTERNAL && "${environment_config%:*}" =~ ^(127\.0\.0\.1|localhost)$ ]]; then
    itt_port_open "${environment_config%:*}" "${environment_config##*:}" \
      || itt_die "no SDK worker pool listens at --environment_config $environment_config: start the cluster (launch/spark_cluster.sh start; status says whether its pool runs) or pass the pool's HOST:PORT"
  fi
fi

# --environment_cache_millis: a job's SDK workers serve its next stage too instead of one started
# per stage task. --sdk_worker_parallelism: one SDK worker per core an executor runs tasks on, as
# the local runner runs one worker process per core (Beam's default is one per executor).
pipeline_args=(--runner=SparkRunner "--spark_master_url=spark://$spark_master" "--spark_version=3"
  "--environment_type=$environment_type" "--environment_config=$environment_config"
  --environment_cache_millis=10000 "--job_name=$job_name")
if [[ -n "$webui" ]] && (( ! dry_run )); then
  per_worker=$("$py" -c 'import json, sys, urllib.request
overview = json.load(urllib.request.urlopen(sys.argv[1] + "/json/", timeout=5))
workers = [w for w in overview.get("workers", []) if w.get("state") == "ALIVE"]
print(max(1, min(w["cores"] for w in workers)) if workers else "")' "$webui" 2>/dev/null || true)
  [[ ! "$per_worker" =~ ^[0-9]+$ ]] || cmd_tail+=("--sdk_worker_parallelism=$per_worker")
fi

job_server_jar=${job_server_jar:-${SPARK_JOB_SERVER_JAR:-}}
if [[ -z "$job_endpoint" ]]; then
  if (( ! dry_run )); then
    if ! check=$(itt_check_job_arguments "$py" "$job_module" "${pipeline_args[@]}" ${job_args[@]+"${job_args[@]}"} 2>&1); then
      printf '%s\n' "$check" >&2
      exit 2
    fi
    itt_need_java "the Spark job server"
  fi
  if [[ -z "$job_server_jar" ]]; then
    if (( dry_run )); then
      job_server_jar="$(itt_cache_dir)/jars/$(itt_spark_job_server_jar_name "$spark_version" "$beam_runner_version")"
    else
      job_server_jar=$(itt_ensure_spark_job_server_jar "$spark_version" "$beam_runner_version") || exit 2
    fi
  fi
fi

cmd=("$py" -m "$job_module" "${pipeline_args[@]}" ${cmd_tail[@]+"${cmd_tail[@]}"})
[[ -z "$job_endpoint" ]] || cmd+=("--job_endpoint=$job_endpoint")
cmd+=(${job_args[@]+"${job_args[@]}"})

if (( dry_run )); then
  [[ -n "$job_endpoint" ]] || cmd+=("--job_endpoint=<the job server started from $job_server_jar>")
  itt_quote_command_redacted "${cmd[@]}"
  itt_check_job_arguments "$py" "$job_module" "${pipeline_args[@]}" ${job_args[@]+"${job_args[@]}"}
  exit 0
fi

# A job server for this job alone, stopped when this script ends however it ends. Started here,
# not by Beam's SparkRunner: that runs `java -jar` without the JVM flags Spark needs on Java 17.
job_server_pid=""
job_server_artifacts=""
if [[ -n "$job_endpoint" ]]; then
  itt_log "job server: $job_endpoint"
else
  trap itt_stop_job_server EXIT
  job_server_log="$(itt_cache_dir)/logs/spark-job-server-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  mkdir -p "$(dirname "$job_server_log")"
  job_server_artifacts=$(mktemp -d "${TMPDIR:-/tmp}/itt-job-server-artifacts.XXXXXX")
  job_port=$(itt_free_port)
  SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} java "${ITT_SPARK_JAVA_OPTIONS[@]}" -cp "$job_server_jar" \
    "$ITT_SPARK_JOB_SERVER_MAIN" --spark-master-url "spark://$spark_master" --artifacts-dir "$job_server_artifacts" \
    --job-host 127.0.0.1 --job-port "$job_port" --artifact-port 0 --expansion-port 0 >"$job_server_log" 2>&1 </dev/null &
  job_server_pid=$!
  if ! itt_wait_port 127.0.0.1 "$job_port" 180 "$job_server_pid"; then
    tail -n 15 "$job_server_log" >&2
    itt_die "Beam's Spark job server did not start (log: $job_server_log)"
  fi
  itt_log "job server: 127.0.0.1:$job_port (log: $job_server_log)"
  job_endpoint=127.0.0.1:$job_port
  cmd+=("--job_endpoint=$job_endpoint")
fi

# cancel_own_jobs: cancels, through the job server's job service, the jobs named $job_name that
# have not ended; prints the ids of those it cancelled or found cancelled. The driver cancels its
# own job when interrupted (beam_jobs/run.py); this covers a driver that could not.
cancel_own_jobs() {
  "$py" - "$job_endpoint" "$job_name" <<'EOF'
import sys
import grpc
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc
State = beam_job_api_pb2.JobState
with grpc.insecure_channel(sys.argv[1]) as channel:
    service = beam_job_api_pb2_grpc.JobServiceStub(channel)
    for job in service.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10).job_info:
        if job.job_name != sys.argv[2] or job.state in (State.DONE, State.FAILED):
            continue
        if job.state not in (State.CANCELLED, State.CANCELLING):
            service.Cancel(beam_job_api_pb2.CancelJobRequest(job_id=job.job_id), timeout=10)
        print(job.job_id)
EOF
}

itt_log "running: $(itt_quote_command_redacted "${cmd[@]}")"
PATH="$(dirname "$py"):$PATH" "${cmd[@]}" &
job_pid=$!
# Interrupted: the driver first (it cancels its job at once, through the job service it holds),
# then a cancel from here for a driver that could not. A job that had already committed is said
# to have, with the driver's exit status: the interrupt came too late to stop it.
on_signal() {
  local cancelled status=0
  trap - INT TERM
  kill -TERM "$job_pid" 2>/dev/null || true
  wait "$job_pid" 2>/dev/null || status=$?
  if (( status == 0 )); then
    itt_log "interrupted, but the job had already finished: its dataset is committed"
    exit 0
  fi
  cancelled=$(cancel_own_jobs 2>/dev/null | tr '\n' ' ' || true)
  itt_log "interrupted: ${cancelled:+cancelled job(s) ${cancelled% } at the job server $job_endpoint; }the job's driver has stopped"
  exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
status=0
wait "$job_pid" || status=$?
exit "$status"

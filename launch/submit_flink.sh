#!/usr/bin/env bash
# Submits the images-to-tfrecords job to a Flink cluster with Beam's FlinkRunner.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"

usage() {
  cat <<EOF
Usage: launch/submit_flink.sh [options] [--] JOB_ARGS...

Runs \`python -m beam_jobs --runner=FlinkRunner ... JOB_ARGS\`. The defaults work against
launch/flink_cluster.sh start. Every argument this script does not know is passed to the job,
e.g. --input DIR --output_dir DIR --image_size 224 --num_shards 16.

Options (defaults in brackets):
  --flink_master HOST:PORT     the JobManager's REST address [127.0.0.1:8081]
  --parallelism N              parallelism of the job [2]
  --environment_type T         where the Python SDK workers run [EXTERNAL]:
                                 EXTERNAL  a worker pool already running next to each TaskManager
                                           (flink_cluster.sh starts one); --environment_config
                                           is its HOST:PORT [127.0.0.1:50000]
                                 DOCKER    a container per worker, from --sdk_image
                                 PROCESS   a command on each TaskManager host; --environment_config
                                           is JSON, e.g. '{"command": "/opt/apache/beam/boot"}'
  --environment_config C       see above
  --sdk_image IMAGE            DOCKER only [apache/beam_pythonX.Y_sdk:<beam version>]; it must
                               contain this package (build FROM the Beam image and pip install .)
  --flink_version V            Flink release of the cluster, e.g. 1.19 or 1.19.3 [$(itt_flink_minor "$ITT_FLINK_VERSION_DEFAULT")];
                               picks the job server built for that minor version
  --beam_runner_version V      Beam Java runner release the job server is built from [$ITT_BEAM_RUNNER_VERSION_DEFAULT]
  --job_endpoint HOST:PORT     a running Beam Flink job server for --flink_master [the one that
                               flink_cluster.sh start keeps for that cluster, else one started
                               for this job from the jar below]
  --flink_job_server_jar JAR   Beam's Flink job server jar, a path or URL, started for this job
                               [\$FLINK_JOB_SERVER_JAR, else built once into the cache from
                               launch/flink_job_server/pom.xml]
  --job_module M               Python module to run [beam_jobs]
  --dry-run                    check the job's arguments with its own parser, print the
                               command and exit; contacts nothing and builds nothing
  -h, --help                   this help

Python: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3.
The job server translates the job and submits it to --flink_master. A cluster that
flink_cluster.sh started keeps one running, which this script uses; otherwise (or with a jar
given) it is a Java process that this script starts for the job and stops after it (java must be
on PATH), its output in \$(cache)/logs/flink-job-server-<time>-<pid>.log. Before that, this script asks the cluster's REST API
for its Flink version and stops with one line if the job server was built for another minor
version. The defaults (Flink 1.19 + Beam Java runner 2.62.0) are pinned in
launch/flink_job_server/pom.xml.
Watch the job at http://<flink_master>/#/job/running.
EOF
}

flink_master=127.0.0.1:8081
parallelism=2
environment_type=EXTERNAL
environment_config=""
sdk_image=""
flink_version=$(itt_flink_minor "$ITT_FLINK_VERSION_DEFAULT")
beam_runner_version=$ITT_BEAM_RUNNER_VERSION_DEFAULT
job_server_jar=""
job_endpoint=""
cmd_tail=()  # options found by probing the cluster, before the job's own arguments
# The Flink job's name: how this script tells its own job from others submitted to the same cluster
# meanwhile (an interrupt cancels only its own). A --job_name among the job's arguments wins.
job_name="images-to-tfrecords-$(date -u +%Y%m%dT%H%M%SZ)-$$"
job_module=beam_jobs
dry_run=0
job_args=()
while (($#)); do
  case "$1" in
    --flink_master) itt_need_value "$@"; flink_master=$2; shift 2 ;;
    --flink_master=*) flink_master=${1#*=}; shift ;;
    --parallelism) itt_need_value "$@"; parallelism=$2; shift 2 ;;
    --parallelism=*) parallelism=${1#*=}; shift ;;
    --environment_type) itt_need_value "$@"; environment_type=$2; shift 2 ;;
    --environment_type=*) environment_type=${1#*=}; shift ;;
    --environment_config) itt_need_value "$@"; environment_config=$2; shift 2 ;;
    --environment_config=*) environment_config=${1#*=}; shift ;;
    --sdk_image) itt_need_value "$@"; sdk_image=$2; shift 2 ;;
    --sdk_image=*) sdk_image=${1#*=}; shift ;;
    --flink_version) itt_need_value "$@"; flink_version=$2; shift 2 ;;
    --flink_version=*) flink_version=${1#*=}; shift ;;
    --flink_job_server_jar) itt_need_value "$@"; job_server_jar=$2; shift 2 ;;
    --job_endpoint) itt_need_value "$@"; job_endpoint=$2; shift 2 ;;
    --job_endpoint=*) job_endpoint=${1#*=}; shift ;;
    --flink_job_server_jar=*) job_server_jar=${1#*=}; shift ;;
    --beam_runner_version) itt_need_value "$@"; beam_runner_version=$2; shift 2 ;;
    --beam_runner_version=*) beam_runner_version=${1#*=}; shift ;;
    --job_module) itt_need_value "$@"; job_module=$2; shift 2 ;;
    --job_module=*) job_module=${1#*=}; shift ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; job_args+=("$@"); break ;;
    *) job_args+=("$1"); shift ;;
  esac
done

[[ "$parallelism" =~ ^[1-9][0-9]*$ ]] || itt_die "--parallelism must be a positive integer (got '$parallelism')"
[[ "$flink_master" =~ ^[^:/]+:[0-9]+$ ]] || itt_die "--flink_master must be HOST:PORT (got '$flink_master')"
[[ -z "$job_endpoint" || "$job_endpoint" =~ ^[^:/]+:[0-9]+$ ]] \
  || itt_die "--job_endpoint must be HOST:PORT (got '$job_endpoint')"
for ((i = 0; i < ${#job_args[@]}; i++)); do
  case "${job_args[i]}" in
    --job_name=*) job_name=${job_args[i]#*=} ;;
    --job_name) job_name=${job_args[i + 1]:-$job_name} ;;
  esac
done
flink_minor=$(itt_flink_minor "$flink_version")
case "$flink_minor" in
  1.19|1.20|2.0|2.1|2.2) ;;
  *) itt_die "--flink_version $flink_version is not supported by Beam's FlinkRunner (expected 1.19, 1.20, 2.0, 2.1 or 2.2)" ;;
esac

# A bad jar fails late, inside Beam, with a Java stack trace: check it before anything else.
if [[ -n "$job_server_jar" ]]; then
  itt_need_jar --flink_job_server_jar "$job_server_jar"
elif [[ -n "${FLINK_JOB_SERVER_JAR:-}" ]]; then
  itt_need_jar FLINK_JOB_SERVER_JAR "$FLINK_JOB_SERVER_JAR"
fi

py=$(itt_python)
environment_config=$(itt_environment_config "$environment_type" "$environment_config" 127.0.0.1:50000 "$sdk_image") || exit 2

# The job server that flink_cluster.sh keeps for this cluster, unless a jar or an endpoint is given.
if [[ -z "$job_endpoint" && -z "$job_server_jar" ]]; then
  if found=$(itt_cluster_job_endpoint "$flink_master"); then
    job_endpoint=$found
  elif [[ -e "$(itt_job_server_record "$flink_master")" ]] && (( ! dry_run )); then
    itt_log "the job server that flink_cluster.sh started for $flink_master is not running (flink_cluster.sh status says so; stop and start the cluster to have it back): starting one for this job"
  fi
elif [[ -n "$job_endpoint" ]] && (( ! dry_run )); then
  itt_need_job_service "$job_endpoint" "start the cluster's job server (launch/flink_cluster.sh start)"
fi

# The job's own argument checks, before contacting the cluster or building anything; with a job
# server already running nothing is built or started, and the job runs the same checks first
# itself (a second interpreter importing the job's parser cost 1.6 s of the start-up).
# --environment_cache_millis: a job's SDK workers serve its next stage too instead of exiting after
# each one (Beam does so where its runner is on the cluster's classpath, as flink_cluster.sh puts
# it): a Flink job of this pipeline started 9 workers, one per stage, each importing Beam again.
pipeline_args=(--runner=FlinkRunner "--flink_master=$flink_master" "--flink_version=$flink_minor"
  "--parallelism=$parallelism" "--environment_type=$environment_type"
  "--environment_config=$environment_config" --environment_cache_millis=10000 "--job_name=$job_name")
if (( ! dry_run )); then
  # Quiet when they pass (the job prints its own start); the job's one line when they do not.
  if [[ -z "$job_endpoint" ]]; then
    if ! check=$(itt_check_job_arguments "$py" "$job_module" "${pipeline_args[@]}" ${job_args[@]+"${job_args[@]}"} 2>&1); then
      printf '%s\n' "$check" >&2
      exit 2
    fi
    itt_need_java "the Flink job server"
  fi
  # The job server translates the pipeline for one Flink minor version; a cluster of another one
  # fails later with a Java stack trace, so ask the cluster first.
  probe=$("$py" - "http://$flink_master/overview" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as response:
        overview = json.load(response)
    print("version", overview.get("flink-version") or "-", overview.get("slots-total", "-"), overview.get("taskmanagers", "-"))
except Exception as e:  # one line for the caller, whatever went wrong
    print("unreachable", f"{type(e).__name__}: {e}")
EOF
  )
  [[ "$probe" == version\ * ]] \
    || itt_die "no Flink REST API answers at http://$flink_master (${probe#unreachable }): start a cluster (launch/flink_cluster.sh start) or pass --flink_master HOST:PORT"
  read -r _ cluster_version cluster_slots cluster_taskmanagers <<<"$probe"
  [[ "$cluster_version" != - ]] || cluster_version=""
  # More parallelism than slots waits for slots forever (the job stays RUNNING, nothing happens).
  if [[ "$cluster_slots" =~ ^[0-9]+$ ]] && (( parallelism > cluster_slots )); then
    itt_die "--parallelism $parallelism is more than the cluster's $cluster_slots task slots (slots-total at http://$flink_master/overview): pass --parallelism $cluster_slots or less, or start a cluster with more (flink_cluster.sh start --slots N --taskmanagers N)"
  fi
  # One SDK worker per task slot, as the local runner runs one worker process per core: Beam's
  # default is one per TaskManager, whose slots then share one Python interpreter (7.2 s against
  # 5.7 s for 2,000 photos on 2 slots). A --sdk_worker_parallelism among the job's arguments wins.
  if [[ "$cluster_slots" =~ ^[0-9]+$ && "$cluster_taskmanagers" =~ ^[1-9][0-9]*$ ]] && (( cluster_slots >= cluster_taskmanagers )); then
    cmd_tail+=("--sdk_worker_parallelism=$((cluster_slots / cluster_taskmanagers))")
  fi
  if [[ -n "$cluster_version" && "$(itt_flink_minor "$cluster_version")" != "$flink_minor" ]]; then
    itt_die "the cluster at $flink_master runs Flink $cluster_version, but the job server is for Flink $flink_minor: pass --flink_version $(itt_flink_minor "$cluster_version") (its job server is built with launch/flink_cluster.sh fetch --flink_version $cluster_version, where the registry serves beam-runners-flink-$(itt_flink_minor "$cluster_version")), or submit to a Flink $flink_minor cluster"
  fi
fi

job_server_jar=${job_server_jar:-${FLINK_JOB_SERVER_JAR:-}}
# A jar named as Beam names them says which Flink minor it was built for; it must be the cluster's.
if [[ -z "$job_endpoint" && "$(basename "$job_server_jar")" =~ ^beam-runners-flink-([0-9]+\.[0-9]+)-job-server ]] \
    && [[ "${BASH_REMATCH[1]}" != "$flink_minor" ]]; then
  itt_die "the job server $(basename "$job_server_jar") is built for Flink ${BASH_REMATCH[1]}, not --flink_version $flink_version: pass the cluster's version and a job server built for it"
fi
if [[ -z "$job_server_jar" && -z "$job_endpoint" ]]; then
  if (( dry_run )); then
    job_server_jar="$(itt_cache_dir)/jars/$(itt_job_server_jar_name "$flink_minor" "$beam_runner_version")"
  else
    job_server_jar=$(itt_ensure_job_server_jar "$flink_minor" "$beam_runner_version") || exit 2
  fi
fi

cmd=("$py" -m "$job_module" "${pipeline_args[@]}")
if [[ -n "$job_endpoint" ]]; then
  cmd+=("--job_endpoint=$job_endpoint")
else
  cmd+=("--flink_job_server_jar=$job_server_jar")
fi
cmd+=(${cmd_tail[@]+"${cmd_tail[@]}"} "${job_args[@]}")

if (( dry_run )); then
  itt_quote_command_redacted "${cmd[@]}"
  itt_check_job_arguments "$py" "$job_module" "${cmd[@]:3}"
  exit 0
fi

# jobs_rest: prints the ids of the cluster's jobs. jobs_rest BEFORE cancel|show: the jobs of this
# script (named $job_name, not among the ids BEFORE printed before the submission) that have not
# ended: cancels them, or only prints them; prints their ids either way.
jobs_rest() {
  "$py" - "http://$flink_master" "$@" "$job_name" <<'EOF'
import json, sys, urllib.request
base = sys.argv[1]
jobs = json.load(urllib.request.urlopen(base + "/jobs/overview", timeout=5))["jobs"]
if len(sys.argv) < 4:
    print(" ".join(j["jid"] for j in jobs))
    sys.exit()
before, action, name = set(sys.argv[2].split()), sys.argv[3], sys.argv[4]
for job in jobs:
    if job["jid"] in before or job.get("name") != name:
        continue
    if job["state"] in ("FINISHED", "FAILED", "CANCELED", "CANCELLING"):
        continue
    if action == "cancel":
        request = urllib.request.Request(f"{base}/jobs/{job['jid']}?mode=cancel", method="PATCH")
        urllib.request.urlopen(request, timeout=5).close()
    print(job["jid"])
EOF
}

# Beam's FlinkRunner would start the job server itself and announce each start and stop on the
# console at WARNING ("Really starting service at localhost:N with cmd: [java, -jar, ...]"), while
# the server's own lines went nowhere at the job's default log level. So this script starts it, its
# output in a log file, and gives the job its endpoint (--job_endpoint); the job server stops when
# this script ends, however it ends. A jar given as a URL is left to Beam, which downloads it.
job_server_pid=""
job_server_artifacts=""
if [[ -n "$job_endpoint" ]]; then
  itt_log "job server: $job_endpoint"
elif [[ ! "$job_server_jar" =~ ^[a-z]+:// ]]; then
  trap itt_stop_job_server EXIT
  job_server_log="$(itt_cache_dir)/logs/flink-job-server-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  mkdir -p "$(dirname "$job_server_log")"
  job_server_artifacts=$(mktemp -d "${TMPDIR:-/tmp}/itt-job-server-artifacts.XXXXXX")
  job_port=$(itt_free_port)
  # Artifact and expansion ports 0: the job server picks free ones and tells the job itself.
  # As Beam's FlinkRunner starts it: the master with its http:// scheme.
  java -jar "$job_server_jar" --flink-master "http://$flink_master" --artifacts-dir "$job_server_artifacts" \
    --job-port "$job_port" --artifact-port 0 --expansion-port 0 >"$job_server_log" 2>&1 </dev/null &
  job_server_pid=$!
  if ! itt_wait_port 127.0.0.1 "$job_port" 180 "$job_server_pid"; then
    tail -n 15 "$job_server_log" >&2
    itt_die "Beam's Flink job server did not start (log: $job_server_log)"
  fi
  itt_log "job server: localhost:$job_port (log: $job_server_log)"
  cmd+=("--job_endpoint=localhost:$job_port")
fi

itt_log "running: $(itt_quote_command_redacted "${cmd[@]}")"
jobs_before=$(jobs_rest 2>/dev/null) || jobs_before="?"  # "?": unknown, so cancel nothing
# The worker pool and the job server start `python`/`java` from PATH.
PATH="$(dirname "$py"):$PATH" "${cmd[@]}" &
job_pid=$!
on_signal() {
  local cancelled=""
  trap - INT TERM
  if [[ "$jobs_before" != "?" ]]; then
    cancelled=$(jobs_rest "${jobs_before:- }" cancel 2>/dev/null | tr '\n' ' ' || true)
  fi
  itt_log "interrupted: ${cancelled:+cancelled Flink job(s) ${cancelled% } at http://$flink_master; }stopping the job's driver"
  kill -TERM "$job_pid" 2>/dev/null || true
  wait "$job_pid" 2>/dev/null || true
  exit "$1"
}
# Interrupted, the driver would leave its job RUNNING on the cluster: cancel it through REST.
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
status=0
wait "$job_pid" || status=$?
if (( status != 0 )) && [[ "$jobs_before" != "?" ]]; then
  # The driver ended in error (it lost the job server, say) while its Flink job may still run.
  running=$(jobs_rest "${jobs_before:- }" show 2>/dev/null | tr '\n' ' ' || true)
  if [[ -n "$running" ]]; then
    itt_log "the job's driver ended (exit $status), but its Flink job ${running% } still runs at http://$flink_master and may still commit: watch it there, or cancel it (curl -X PATCH 'http://$flink_master/jobs/${running%% *}?mode=cancel')"
  fi
fi
exit "$status"

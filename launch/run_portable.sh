#!/usr/bin/env bash
# Runs the images-to-tfrecords job through Beam's portable protocol: a job service plus an SDK
# worker pool on loopback. This is the protocol every cluster runner (Flink, Spark, Dataflow) speaks.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"

usage() {
  cat <<EOF
Usage: launch/run_portable.sh [options] [--] JOB_ARGS...

Runs \`python -m beam_jobs --runner=PortableRunner --job_endpoint=... --environment_type=EXTERNAL
--environment_config=... JOB_ARGS\`. Unless told to use running ones, it starts Beam's Python job
service (apache_beam.runners.portability.local_job_service_main) and an SDK worker pool on
127.0.0.1, and stops them when the job ends, whether it succeeded or not.

Options (defaults in brackets):
  --job_endpoint HOST:PORT   use this running job service instead of starting one
  --worker_pool HOST:PORT    use this running worker pool instead of starting one
  --job_port P               port for the job service it starts [a free one]
  --worker_pool_port P       port for the worker pool it starts [a free one]
  --log_dir DIR              logs of the services it starts [a temp dir, kept on failure]
  --job_module M             Python module to run [beam_jobs]
  --dry-run                  check the job's arguments with its own parser, print the job's
                             command and exit (starts nothing)
  -h, --help                 this help

Every other argument goes to the job, e.g. --input DIR --output_dir DIR --num_shards 16.
Python: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3.
EOF
}

job_endpoint=""
worker_pool=""
job_port=""
worker_pool_port=""
log_dir=""
job_module=beam_jobs
dry_run=0
job_args=()
while (($#)); do
  case "$1" in
    --job_endpoint) itt_need_value "$@"; job_endpoint=$2; shift 2 ;;
    --job_endpoint=*) job_endpoint=${1#*=}; shift ;;
    --worker_pool) itt_need_value "$@"; worker_pool=$2; shift 2 ;;
    --worker_pool=*) worker_pool=${1#*=}; shift ;;
    --job_port) itt_need_value "$@"; job_port=$2; shift 2 ;;
    --job_port=*) job_port=${1#*=}; shift ;;
    --worker_pool_port) itt_need_value "$@"; worker_pool_port=$2; shift 2 ;;
    --worker_pool_port=*) worker_pool_port=${1#*=}; shift ;;
    --log_dir) itt_need_value "$@"; log_dir=$2; shift 2 ;;
    --log_dir=*) log_dir=${1#*=}; shift ;;
    --job_module) itt_need_value "$@"; job_module=$2; shift 2 ;;
    --job_module=*) job_module=${1#*=}; shift ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; job_args+=("$@"); break ;;
    *) job_args+=("$1"); shift ;;
  esac
done

host=127.0.0.1
py=$(itt_python)
[[ -z "$job_port" ]] || itt_need_port --job_port "$job_port"
[[ -z "$worker_pool_port" ]] || itt_need_port --worker_pool_port "$worker_pool_port"
# gRPC binds with SO_REUSEPORT: a service started on a port in use starts beside the other
# listener, and the job then hangs talking to the wrong one. Refuse such a port up front.
if (( ! dry_run )); then
  [[ -z "$job_port" || -n "$job_endpoint" ]] || itt_need_free_port "$host" "$job_port" --job_port
  [[ -z "$worker_pool_port" || -n "$worker_pool" ]] || itt_need_free_port "$host" "$worker_pool_port" --worker_pool_port
fi
job_port=${job_port:-$(itt_free_port)}
worker_pool_port=${worker_pool_port:-$(itt_free_port)}
job_endpoint=${job_endpoint:-$host:$job_port}
worker_pool=${worker_pool:-$host:$worker_pool_port}

cmd=("$py" -m "$job_module"
  --runner=PortableRunner
  "--job_endpoint=$job_endpoint"
  --environment_type=EXTERNAL
  "--environment_config=$worker_pool"
  "${job_args[@]}")
if (( dry_run )); then
  itt_quote_command_redacted "${cmd[@]}"
  itt_check_job_arguments "$py" "$job_module" "${cmd[@]:3}"
  exit 0
fi

started_log_dir=0
if [[ -z "$log_dir" ]]; then
  log_dir=$(mktemp -d "${TMPDIR:-/tmp}/run_portable.XXXXXX")
  started_log_dir=1
fi
mkdir -p "$log_dir"
status=1
cleanup() {
  itt_stop_pid "$log_dir/job-service.pid" 15 "$ITT_JOB_SERVICE_MARKER"
  itt_stop_pid "$log_dir/worker-pool.pid" 15 "$ITT_WORKER_POOL_MARKER"
  if (( status == 0 && started_log_dir )); then
    rm -rf "$log_dir"
  elif (( status != 0 )); then
    itt_log "logs of the services: $log_dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ "$job_endpoint" == "$host:$job_port" ]]; then
  itt_start_job_service "$host" "$job_port" "$log_dir/job-service.pid" "$log_dir/job-service.log"
fi
if [[ "$worker_pool" == "$host:$worker_pool_port" ]]; then
  itt_start_worker_pool "$host" "$worker_pool_port" "$log_dir/worker-pool.pid" "$log_dir/worker-pool.log"
fi

itt_log "running: $(itt_quote_command_redacted "${cmd[@]}")"
set +e
PATH="$(dirname "$py"):$PATH" "${cmd[@]}"
status=$?
set -e
exit "$status"

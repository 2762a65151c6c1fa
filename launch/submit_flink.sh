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
  --flink_version V            Flink release of the cluster, e.g. 1.20 or 1.20.3 [1.20];
                               picks beam-runners-flink-<minor>-job-server
  --flink_job_server_jar JAR   Beam's Flink job server jar, a path or URL [fetched once from
                               Maven Central into the cache; or \$FLINK_JOB_SERVER_JAR]
  --job_module M               Python module to run [beam_jobs]
  --dry-run                    print the command and exit without running it
  -h, --help                   this help

Python: \$PYTHON, else .venv/bin/python, else python3. The job server is a Java process that
this script's Python starts (java must be on PATH); it translates the job and submits it to
--flink_master. Watch it at http://<flink_master>/#/job/running.
EOF
}

flink_master=127.0.0.1:8081
parallelism=2
environment_type=EXTERNAL
environment_config=""
sdk_image=""
flink_version=$(itt_flink_minor "$ITT_FLINK_VERSION_DEFAULT")
job_server_jar=""
job_module=beam_jobs
dry_run=0
job_args=()
while (($#)); do
  case "$1" in
    --flink_master) flink_master=$2; shift 2 ;;
    --flink_master=*) flink_master=${1#*=}; shift ;;
    --parallelism) parallelism=$2; shift 2 ;;
    --parallelism=*) parallelism=${1#*=}; shift ;;
    --environment_type) environment_type=$2; shift 2 ;;
    --environment_type=*) environment_type=${1#*=}; shift ;;
    --environment_config) environment_config=$2; shift 2 ;;
    --environment_config=*) environment_config=${1#*=}; shift ;;
    --sdk_image) sdk_image=$2; shift 2 ;;
    --sdk_image=*) sdk_image=${1#*=}; shift ;;
    --flink_version) flink_version=$2; shift 2 ;;
    --flink_version=*) flink_version=${1#*=}; shift ;;
    --flink_job_server_jar) job_server_jar=$2; shift 2 ;;
    --flink_job_server_jar=*) job_server_jar=${1#*=}; shift ;;
    --job_module) job_module=$2; shift 2 ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; job_args+=("$@"); break ;;
    *) job_args+=("$1"); shift ;;
  esac
done

[[ "$parallelism" =~ ^[1-9][0-9]*$ ]] || itt_die "--parallelism must be a positive integer (got '$parallelism')"
[[ "$flink_master" =~ ^[^:/]+:[0-9]+$ ]] || itt_die "--flink_master must be HOST:PORT (got '$flink_master')"
flink_minor=$(itt_flink_minor "$flink_version")
case "$flink_minor" in
  1.19|1.20|2.0|2.1|2.2) ;;
  *) itt_die "--flink_version $flink_version is not supported by Beam's FlinkRunner (expected 1.19, 1.20, 2.0, 2.1 or 2.2)" ;;
esac

py=$(itt_python)
case "$environment_type" in
  EXTERNAL)
    environment_config=${environment_config:-127.0.0.1:50000}
    [[ "$environment_config" =~ ^[^:]+:[0-9]+$ ]] \
      || itt_die "EXTERNAL needs --environment_config HOST:PORT of a worker pool (got '$environment_config')"
    ;;
  DOCKER)
    if [[ -z "$sdk_image" ]]; then
      sdk_image=$(printf 'apache/beam_python%s_sdk:%s' \
        "$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" "$(itt_beam_version)")
    fi
    environment_config=$sdk_image
    ;;
  PROCESS)
    [[ -n "$environment_config" ]] \
      || itt_die "PROCESS needs --environment_config '{\"command\": \"/path/to/boot\"}'"
    ;;
  *) itt_die "--environment_type must be EXTERNAL, DOCKER or PROCESS (got '$environment_type')" ;;
esac

if [[ -z "$job_server_jar" ]]; then
  if (( dry_run )) && [[ -z "${FLINK_JOB_SERVER_JAR:-}" ]]; then
    job_server_jar="$(itt_cache_dir)/jars/beam-runners-flink-$flink_minor-job-server-$(itt_beam_version).jar"
  else
    job_server_jar=$(itt_ensure_job_server_jar "$flink_minor" "$(itt_beam_version)") \
      || itt_die "no Flink job server jar; see the message above"
  fi
fi

cmd=("$py" -m "$job_module"
  --runner=FlinkRunner
  "--flink_master=$flink_master"
  "--flink_version=$flink_minor"
  "--flink_job_server_jar=$job_server_jar"
  "--parallelism=$parallelism"
  "--environment_type=$environment_type"
  "--environment_config=$environment_config"
  "${job_args[@]}")

if (( dry_run )); then
  itt_quote_command "${cmd[@]}"
  exit 0
fi
itt_log "running: $(itt_quote_command "${cmd[@]}")"
# The worker pool and the job server start `python`/`java` from PATH.
PATH="$(dirname "$py"):$PATH" exec "${cmd[@]}"

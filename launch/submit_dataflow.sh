#!/usr/bin/env bash
# Submits the images-to-tfrecords job to Google Cloud Dataflow; --dry-run checks it offline.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"

usage() {
  cat <<EOF
Usage: launch/submit_dataflow.sh --project P --region R --temp_location gs://B/tmp [options] [--] JOB_ARGS...

Runs \`python -m beam_jobs --runner=DataflowRunner ... JOB_ARGS\`. Job arguments (--input gs://...,
--output_dir gs://..., --image_size, --num_shards, ...) are passed through unchanged.

Required:
  --project P                  GCP project id
  --region R                   Dataflow region, e.g. europe-west1
  --temp_location gs://...     scratch space for the job
Options (defaults in brackets):
  --staging_location gs://...  where the package and pipeline are staged [<temp_location>/staging]
  --setup_file FILE            builds the package that every worker installs [./setup.py of this
                               repo]; pass '' when --sdk_container_image already contains it
  --sdk_container_image IMAGE  custom worker image (FROM apache/beam_pythonX.Y_sdk, pip install .)
  --machine_type T             worker machine type, e.g. n2-standard-4 [Dataflow's default]
  --num_workers N              initial workers [Dataflow's default]
  --max_num_workers N          autoscaling ceiling [Dataflow's default]
  --job_name NAME              Dataflow job name [Beam's default: beamapp-<user>-<time>]
  --service_account EMAIL      worker service account [the Compute Engine default]
  --job_module M               Python module to run [beam_jobs]
  --dry-run                    print the full command, check the job's arguments with the job's
                               own parser and the Dataflow options with Beam's validator, and
                               exit without submitting; makes no network call at all
  -h, --help                   this help

Python: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3. Submitting needs apache-beam[gcp] and
credentials (gcloud auth application-default login, or GOOGLE_APPLICATION_CREDENTIALS).
EOF
}

project=""
region=""
temp_location=""
staging_location=""
setup_file="$ITT_REPO_ROOT/setup.py"
sdk_container_image=""
machine_type=""
num_workers=""
max_num_workers=""
job_name=""
service_account=""
job_module=beam_jobs
dry_run=0
job_args=()
while (($#)); do
  case "$1" in
    --project|--region|--temp_location|--staging_location|--sdk_container_image|\
    --machine_type|--num_workers|--max_num_workers|--job_name|--service_account|--job_module)
      itt_need_value "$@"
      printf -v "${1#--}" '%s' "$2"; shift 2 ;;
    --setup_file)
      # '' is a value here (the image already holds the package).
      (($# >= 2)) || itt_die "$1 needs a value ('' for none; see --help)"
      [[ "$2" != --* ]] || itt_die "$1 needs a value, got the option '$2' instead ('' for none; see --help)"
      setup_file=$2; shift 2 ;;
    --project=*|--region=*|--temp_location=*|--staging_location=*|--setup_file=*|\
    --sdk_container_image=*|--machine_type=*|--num_workers=*|--max_num_workers=*|--job_name=*|\
    --service_account=*|--job_module=*)
      name=${1%%=*}; printf -v "${name#--}" '%s' "${1#*=}"; shift ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; job_args+=("$@"); break ;;
    *) job_args+=("$1"); shift ;;
  esac
done

[[ -n "$project" ]] || itt_die "--project is required"
[[ -n "$region" ]] || itt_die "--region is required"
[[ "$temp_location" == gs://?* ]] || itt_die "--temp_location must be a gs:// path (got '$temp_location')"
staging_location=${staging_location:-${temp_location%/}/staging}
[[ "$staging_location" == gs://?* ]] || itt_die "--staging_location must be a gs:// path (got '$staging_location')"
if [[ -n "$setup_file" ]]; then
  [[ -f "$setup_file" ]] || itt_die "--setup_file $setup_file does not exist"
  setup_file=$(cd "$(dirname "$setup_file")" && pwd)/$(basename "$setup_file")
fi
for n in "$num_workers" "$max_num_workers"; do
  [[ -z "$n" || "$n" =~ ^[1-9][0-9]*$ ]] || itt_die "worker counts must be positive integers (got '$n')"
done

py=$(itt_python)
cmd=("$py" -m "$job_module"
  --runner=DataflowRunner
  "--project=$project"
  "--region=$region"
  "--temp_location=$temp_location"
  "--staging_location=$staging_location")
[[ -n "$setup_file" ]] && cmd+=("--setup_file=$setup_file")
[[ -n "$sdk_container_image" ]] && cmd+=("--sdk_container_image=$sdk_container_image")
[[ -n "$machine_type" ]] && cmd+=("--machine_type=$machine_type")
[[ -n "$num_workers" ]] && cmd+=("--num_workers=$num_workers")
[[ -n "$max_num_workers" ]] && cmd+=("--max_num_workers=$max_num_workers")
[[ -n "$job_name" ]] && cmd+=("--job_name=$job_name")
[[ -n "$service_account" ]] && cmd+=("--service_account_email=$service_account")
cmd+=("${job_args[@]}")

# Beam's Dataflow validator, offline. The job's own arguments are checked before, by the job's
# parser. Left alone, the validator asks GCS about the temp and staging buckets (soft-delete
# policy), and creates a default bucket when both paths are invalid: minutes of timeouts, or a
# long traceback, without credentials. Here those two calls are switched off, and an audit hook
# turns any other attempt to open a connection into an error, so the dry run never reaches out.
VALIDATE_PY='
import sys

def _no_network(event, args):
    if event in ("socket.connect", "socket.getaddrinfo"):
        raise RuntimeError(f"the dry run must not reach the network ({event} {args[1]!r})")
sys.addaudithook(_no_network)

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions, PipelineOptions, SetupOptions, StandardOptions, TestOptions, WorkerOptions)
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator

options = PipelineOptions(sys.argv[1:])
options.view_as(TestOptions).dry_run = True  # Beam then skips its soft-delete lookups on GCS
GoogleCloudOptions._create_default_gcs_bucket = lambda self: None  # report bad paths, create nothing
errors = []
if options.view_as(StandardOptions).runner != "DataflowRunner":
    errors.append("runner is not DataflowRunner")
class _Dataflow:  # the validator only looks at the runner class name
    pass
_Dataflow.__name__ = "DataflowRunner"
errors += PipelineOptionsValidator(options, _Dataflow()).validate()
if errors:
    print("invalid Dataflow arguments: " + "; ".join(" ".join(e.split()) for e in errors))
    sys.exit(2)
gcp = options.view_as(GoogleCloudOptions)
setup = options.view_as(SetupOptions)
worker = options.view_as(WorkerOptions)
print(f"ok: project={gcp.project} region={gcp.region} temp_location={gcp.temp_location} "
      f"staging_location={gcp.staging_location} setup_file={setup.setup_file} "
      f"sdk_container_image={worker.sdk_container_image} machine_type={worker.machine_type} "
      f"num_workers={worker.num_workers}")
'

if (( dry_run )); then
  itt_quote_command_redacted "${cmd[@]}"
  itt_check_job_arguments "$py" "$job_module" "${cmd[@]:3}"
  validate_log=$(mktemp "${TMPDIR:-/tmp}/submit_dataflow.XXXXXX")
  if ! result=$(PATH="$(dirname "$py"):$PATH" "$py" -c "$VALIDATE_PY" "${cmd[@]:3}" 2>"$validate_log"); then
    [[ -n "$result" ]] || result="the Dataflow option check failed: $(tail -n 1 "$validate_log")"
    rm -f "$validate_log"
    itt_die "$result"
  fi
  rm -f "$validate_log"
  printf '%s\n' "$result" >&2
  exit 0
fi

"$py" -c 'import apache_beam.io.gcp.gcsio, google.cloud.storage, apitools' 2>/dev/null \
  || itt_die "DataflowRunner needs the GCP extras: $py -m pip install 'apache-beam[gcp]'"
itt_log "running: $(itt_quote_command_redacted "${cmd[@]}")"
exec "${cmd[@]}"

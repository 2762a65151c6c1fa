#!/usr/bin/env bash
# Starts, stops and reports on a real Spark standalone cluster on loopback (a Master and Worker(s)
# as separate processes), a Beam Python SDK worker pool and Beam's Spark job server.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"
# shellcheck source=launch/_spark.sh
source "$ITT_REPO_ROOT/launch/_spark.sh"

usage() {
  cat <<EOF
Usage: launch/spark_cluster.sh start|stop|status|fetch [options]

  start   install Spark and build Beam's Spark job server (first run), then start a Master, the
          Worker(s), each restarted by its supervisor when it dies, a Beam SDK worker pool and
          Beam's Spark job server; waits until all are ready and prints the submit_spark.sh
          flags that reach them; refuses while the state dir's cluster is still running
  stop    stop everything that 'start' started in the same --state_dir (safe to repeat)
  status  print the Master's overview, the workers', the worker pool's and the job server's
          state; exits 1 when the cluster is not up or a part of it is down
          (stop and status read the ports that start saved in the state dir, unless given)
  fetch   install Spark and build Beam's Spark job server jar into the cache
          (start and submit_spark.sh do it on first use; fetch does it ahead of time)

Options (defaults in brackets):
  --spark_version V        Spark release of the cluster and of the job server [$ITT_SPARK_VERSION_DEFAULT]
  --beam_runner_version V  Beam Java runner of the job server [$ITT_SPARK_BEAM_RUNNER_VERSION_DEFAULT];
                           both defaults come from launch/spark_job_server/pom.xml
  --state_dir DIR          pid files, logs, the workers' folders [\$(cache)/spark-cluster]
  --master_port P          the Master's port (spark://127.0.0.1:P) [7077]
  --webui_port P           the Master's web UI [8080]
  --worker_pool_port P     SDK worker pool port [50001]; 0 = no worker pool
  --job_server_port P      Beam's Spark job server, kept up for every job [8098]; 0 = none:
                           then submit_spark.sh starts one per job
  --workers N              Worker processes [1]
  --cores N                cores each Worker offers [2]
  --worker_memory M        memory each Worker offers its executors [2g]
  --restart_delay S        seconds before a dead Worker is started again [2]
  --timeout S              seconds to wait for each service [120]
  -h, --help               this help

Everything binds 127.0.0.1. Needs Java 11 or 17; fetch also needs Maven (mvn) unless
\$SPARK_JOB_SERVER_JAR names a jar built elsewhere. Spark comes from PyPI's pyspark, into the cache:
\${IMAGES_TO_TFRECORDS_CACHE:-\${XDG_CACHE_HOME:-\$HOME/.cache}/images-to-tfrecords}
Python for the worker pool: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3.
EOF
}

command=${1:-}
[[ -n "$command" ]] || { usage >&2; exit 2; }
shift
case "$command" in
  -h|--help) usage; exit 0 ;;
  start|stop|status|fetch) ;;
  *) itt_die "unknown command '$command' (expected start, stop, status or fetch)" ;;
esac

spark_version=$ITT_SPARK_VERSION_DEFAULT
beam_runner_version=$ITT_SPARK_BEAM_RUNNER_VERSION_DEFAULT
state_dir="$(itt_cache_dir)/spark-cluster"
master_port=7077
webui_port=8080
worker_pool_port=50001
job_server_port=8098
workers=1
cores=2
worker_memory=2g
restart_delay=2
timeout=120
given_ports=" "
while (($#)); do
  case "$1" in
    --spark_version) itt_need_value "$@"; spark_version=$2; shift 2 ;;
    --beam_runner_version) itt_need_value "$@"; beam_runner_version=$2; shift 2 ;;
    --state_dir) itt_need_value "$@"; state_dir=$2; shift 2 ;;
    --master_port) itt_need_value "$@"; master_port=$2; given_ports+="master_port "; shift 2 ;;
    --webui_port) itt_need_value "$@"; webui_port=$2; given_ports+="webui_port "; shift 2 ;;
    --worker_pool_port) itt_need_value "$@"; worker_pool_port=$2; given_ports+="worker_pool_port "; shift 2 ;;
    --job_server_port) itt_need_value "$@"; job_server_port=$2; given_ports+="job_server_port "; shift 2 ;;
    --workers) itt_need_value "$@"; workers=$2; shift 2 ;;
    --cores) itt_need_value "$@"; cores=$2; shift 2 ;;
    --worker_memory) itt_need_value "$@"; worker_memory=$2; shift 2 ;;
    --restart_delay) itt_need_value "$@"; restart_delay=$2; shift 2 ;;
    --timeout) itt_need_value "$@"; timeout=$2; shift 2 ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h|--help) usage; exit 0 ;;
    *) itt_die "unknown option '$1' (see --help)" ;;
  esac
done
[[ "$spark_version" =~ ^3\.[0-9]+\.[0-9]+$ ]] \
  || itt_die "--spark_version must be a Spark 3 release X.Y.Z, e.g. $ITT_SPARK_VERSION_DEFAULT (got '$spark_version'; Beam's runner is built for Spark 3)"
[[ "$worker_memory" =~ ^[0-9]+[mMgG]$ ]] || itt_die "--worker_memory must be a size such as 2g or 1536m (got '$worker_memory')"
[[ -n "$state_dir" ]] || itt_die "--state_dir must not be empty"
state_dir=$(realpath -m -- "$state_dir")
ports_file="$state_dir/ports"
if [[ "$command" == stop || "$command" == status ]]; then
  itt_load_saved_ports "$ports_file" "$given_ports" master_port webui_port worker_pool_port job_server_port workers
fi
itt_need_port --master_port "$master_port"
itt_need_port --webui_port "$webui_port"
itt_need_port --worker_pool_port "$worker_pool_port" 0
itt_need_port --job_server_port "$job_server_port" 0
itt_need_int --workers "$workers" 1
itt_need_int --cores "$cores" 1
# Spark lets a Worker offer more cores than the machine has (its tasks then share them): allowed,
# as Spark allows it, but said, since a job's parallelism follows the cores offered.
if (( 10#$cores > $(nproc) )); then
  itt_log "warning: --cores $((10#$cores)) is more than the $(nproc) cores here: each Worker's tasks will share them"
fi
itt_need_int --restart_delay "$restart_delay" 0
itt_need_int --timeout "$timeout" 1
master_port=$((10#$master_port)) webui_port=$((10#$webui_port)) worker_pool_port=$((10#$worker_pool_port))
job_server_port=$((10#$job_server_port))
itt_need_distinct_ports master_port webui_port worker_pool_port job_server_port

host=127.0.0.1
master_url="spark://$host:$master_port"
SPARK_MASTER_CLASS=org.apache.spark.deploy.master.Master
# A Worker's supervisor is a bash loop; this name, its $0, is how stop and status know it.
SUPERVISOR_MARKER=itt-spark-worker-supervisor
log_dir="$state_dir/log"
pid_dir="$state_dir/pid"
master_pidfile="$pid_dir/master.pid"
pool_pidfile="$pid_dir/worker-pool.pid"
job_server_pidfile="$pid_dir/job-server.pid"
job_server_record=$(itt_job_server_record "$host:$master_port" spark-)
STOP_HINT="launch/spark_cluster.sh stop"

# Spark's scripts read these: every address loopback, its scratch and the workers' folders here.
spark_env() {
  export SPARK_HOME SPARK_LOCAL_IP=$host SPARK_LOCAL_HOSTNAME=$host SPARK_LOCAL_DIRS="$state_dir/tmp"
  export SPARK_CONF_DIR="$state_dir/conf"
  # Each application copies the job server's jar (271 MB) into its folder under work/: the
  # Worker removes a finished application's folder after an hour (and stop removes them all).
  export SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 -Dspark.worker.cleanup.appDataTtl=3600"
}

write_config() {
  mkdir -p "$log_dir" "$pid_dir" "$state_dir/tmp" "$state_dir/work" "$state_dir/conf" "$state_dir/artifacts"
  printf 'master_port=%s\nwebui_port=%s\nworker_pool_port=%s\njob_server_port=%s\nworkers=%s\n' \
    "$master_port" "$webui_port" "$worker_pool_port" "$job_server_port" "$workers" >"$ports_file"
  printf '%s\n' "$SPARK_HOME" >"$state_dir/spark_home"
}

# start_worker I: a supervisor in its own session that runs Worker I and starts it again
# --restart_delay seconds after it dies (a killed Worker's application waits, without a word,
# for a Worker to come back, and then finishes), until stop ends its whole process group.
start_worker() {
  local i=$1
  # The Worker runs in the background of its supervisor so that a SIGTERM to the supervisor (or to
  # its group) ends the Worker too, instead of leaving it without one; the Worker's class is
  # passed in two parts, so that the supervisor's own command line does not name it.
  setsid bash -c 'spark_class=$1 package=$2 master=$3 cores=$4 memory=$5 work=$6 delay=$7 log=$8 worker=""
    trap '"'"'[[ -z "$worker" ]] || kill -TERM "$worker" 2>/dev/null; wait; exit 143'"'"' TERM INT
    while :; do
      printf "[%s] starting the Worker\n" "$(date -u +%FT%TZ)" >>"$log"
      "$spark_class" "$package.Worker" --host 127.0.0.1 --webui-port 0 \
        --cores "$cores" --memory "$memory" --work-dir "$work" "$master" >>"$log" 2>&1 </dev/null &
      worker=$!
      wait "$worker" || true
      worker=""
      printf "[%s] the Worker exited; starting it again in %s s\n" "$(date -u +%FT%TZ)" "$delay" >>"$log"
      sleep "$delay"
    done' "$SUPERVISOR_MARKER" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker "$master_url" "$cores" \
    "$worker_memory" "$state_dir/work" "$restart_delay" "$log_dir/worker-$i.log" >/dev/null 2>&1 </dev/null &
  echo "$!" >"$pid_dir/worker-$i.pid"
}

# stop_worker_group PIDFILE: ends the process group of a Worker's supervisor (the supervisor, its
# Worker, the executors that Worker started), even when the supervisor itself is gone: its Worker
# then still runs in that group, and would join the next cluster's Master. Only processes whose
# command line is one of these is signalled.
stop_worker_group() {
  local group members=() pid waited=0
  group=$(head -n 1 "$1" 2>/dev/null || true)
  rm -f "$1"
  [[ "$group" =~ ^[0-9]+$ ]] || return 0
  while read -r pid; do
    itt_pid_is "$pid" "$SUPERVISOR_MARKER" org.apache.spark.deploy.worker.Worker CoarseGrainedExecutorBackend \
      && members+=("$pid")
  done < <(ps -e -o pid= -o pgid= | awk -v group="$group" '$2 == group { print $1 }')
  (( ${#members[@]} )) || return 0
  kill -TERM "${members[@]}" 2>/dev/null || true
  while kill -0 "${members[@]}" 2>/dev/null && (( waited < 20 )); do sleep 1; waited=$((waited + 1)); done
  kill -KILL "${members[@]}" 2>/dev/null || true
}

# master_json: the Master's state (its web UI's /json/), one line of JSON.
master_json() {
  "$(itt_python)" -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().replace("\n", " "))' "http://$host:$webui_port/json/"
}

# alive_workers: how many Workers the Master counts as alive (0 when it does not answer).
alive_workers() {
  master_json 2>/dev/null | "$(itt_python)" -c 'import json, sys
print(json.load(sys.stdin).get("aliveworkers", 0))' 2>/dev/null || echo 0
}

wait_workers() {
  local waited=0 n
  while :; do
    n=$(alive_workers)
    (( n >= workers )) && return 0
    (( waited >= timeout )) && { itt_log "only $n of $workers Workers registered after ${timeout}s (logs: $log_dir)"; return 1; }
    sleep 1
    waited=$((waited + 1))
  done
}

# start_job_server JAR: Beam's Spark job server for every job of this cluster, with the JVM flags
# spark-submit would give it (it runs each job's Spark driver in its own JVM).
start_job_server() {
  local pid
  setsid java "${ITT_SPARK_JAVA_OPTIONS[@]}" -cp "$1" "$ITT_SPARK_JOB_SERVER_MAIN" --spark-master-url "$master_url" \
    --job-host "$host" --job-port "$job_server_port" --artifact-port 0 --expansion-port 0 \
    --artifacts-dir "$state_dir/artifacts" >"$log_dir/job-server.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$job_server_pidfile"
  itt_wait_port "$host" "$job_server_port" "$timeout" "$pid" || { tail -n 15 "$log_dir/job-server.log" >&2; return 1; }
  mkdir -p "$(dirname "$job_server_record")"
  printf '%s %s:%s http://%s:%s\n' "$pid" "$host" "$job_server_port" "$host" "$webui_port" >"$job_server_record"
}

# live_pids: the pids in the state dir's pid files that are still this cluster's processes.
live_pids() {
  local f pid
  for f in "$pid_dir"/*.pid; do
    [[ -f "$f" ]] || continue
    pid=$(head -n 1 "$f")
    case "$f" in
      "$pool_pidfile") itt_pid_is "$pid" "$ITT_WORKER_POOL_MARKER" && echo "$pid" ;;
      "$job_server_pidfile") itt_pid_is "$pid" "$ITT_SPARK_JOB_SERVER_MAIN" && echo "$pid" ;;
      "$master_pidfile") itt_pid_is "$pid" "$SPARK_MASTER_CLASS" && echo "$pid" ;;
      *) itt_pid_is "$pid" "$SUPERVISOR_MARKER" && echo "$pid" ;;
    esac
  done
  return 0
}

do_stop() {
  local f stoppers=()
  # Only pids whose command line is ours are stopped: a stale pid file may name someone else's.
  if [[ -f "$job_server_record" && -f "$job_server_pidfile" ]] \
      && [[ "$(cut -d' ' -f1 "$job_server_record")" == "$(head -n 1 "$job_server_pidfile")" ]]; then
    rm -f "$job_server_record"
  fi
  # Side by side, and waited for by pid: a bare `wait` in a failed start also waited for the
  # Master, which that start launched as its own child and which nothing had stopped yet.
  itt_stop_pid "$job_server_pidfile" 15 "$ITT_SPARK_JOB_SERVER_MAIN" &
  stoppers+=($!)
  itt_stop_pid "$pool_pidfile" 15 "$ITT_WORKER_POOL_MARKER" &
  stoppers+=($!)
  for f in "$pid_dir"/worker-*.pid; do
    [[ -f "$f" ]] || continue
    stop_worker_group "$f" &
    stoppers+=($!)
  done
  wait "${stoppers[@]}" || true
  itt_stop_pid "$master_pidfile" 20 "$SPARK_MASTER_CLASS"
  rm -rf "$state_dir/work" "$state_dir/tmp"
}

case "$command" in
  fetch)
    if [[ -n "${SPARK_JOB_SERVER_JAR:-}" ]]; then itt_need_jar SPARK_JOB_SERVER_JAR "$SPARK_JOB_SERVER_JAR"; fi
    itt_need_java "Spark and its job server"
    SPARK_HOME=$(itt_ensure_spark_dist "$spark_version") || exit 2
    itt_log "Spark $spark_version: $SPARK_HOME"
    jar=$(itt_ensure_spark_job_server_jar "$spark_version" "$beam_runner_version") || exit 2
    itt_log "job server jar: $jar"
    ;;
  start)
    itt_need_java "Spark"
    running=$(live_pids | tr '\n' ' ')
    [[ -z "$running" ]] \
      || itt_die "a cluster of state dir $state_dir is already running (pids ${running% }); stop it first: launch/spark_cluster.sh stop --state_dir $state_dir"
    itt_need_free_port "$host" "$master_port" --master_port "$STOP_HINT"
    itt_need_free_port "$host" "$webui_port" --webui_port "$STOP_HINT"
    (( worker_pool_port == 0 )) || itt_need_free_port "$host" "$worker_pool_port" --worker_pool_port "$STOP_HINT"
    (( job_server_port == 0 )) || itt_need_free_port "$host" "$job_server_port" --job_server_port "$STOP_HINT"
    SPARK_HOME=$(itt_ensure_spark_dist "$spark_version") || exit 2
    jar=""
    if (( job_server_port != 0 )); then
      jar=$(itt_ensure_spark_job_server_jar "$spark_version" "$beam_runner_version") || exit 2
    fi
    rm -f "$pid_dir"/*.pid  # stale ones (nothing in them runs any more, checked above)
    write_config
    spark_env
    trap 'itt_log "start failed; stopping what was started"; do_stop' ERR
    trap 'trap - ERR; itt_log "interrupted; stopping what was started"; do_stop; exit 130' INT TERM
    setsid "$SPARK_HOME/bin/spark-class" "$SPARK_MASTER_CLASS" --host "$host" --port "$master_port" \
      --webui-port "$webui_port" >"$log_dir/master.log" 2>&1 </dev/null &
    echo "$!" >"$master_pidfile"
    ITT_PORT_HELD_BY=""
    if ! itt_wait_port "$host" "$webui_port" "$timeout" "$(cat "$master_pidfile")"; then
      held=${ITT_PORT_HELD_BY:+port $webui_port (--webui_port) is held by $ITT_PORT_HELD_BY}
      why=$(grep -m 1 -E 'Exception|ERROR' "$log_dir/master.log" || true)
      trap - ERR
      do_stop
      itt_die "the Master did not come up${held:+: $held}${why:+: ${why:0:300}} (log: $log_dir/master.log)"
    fi
    itt_wait_port "$host" "$master_port" "$timeout" "$(cat "$master_pidfile")"
    for ((i = 0; i < workers; i++)); do start_worker "$i"; done
    wait_workers
    if (( worker_pool_port != 0 )); then
      itt_start_worker_pool "$host" "$worker_pool_port" "$pool_pidfile" "$log_dir/worker-pool.log"
    fi
    [[ -z "$jar" ]] || start_job_server "$jar"
    trap - ERR INT TERM
    summary="$workers Worker(s) x $cores cores"
    submit_flags="--spark_master $host:$master_port"
    if (( worker_pool_port != 0 )); then
      summary+=", worker pool $host:$worker_pool_port"
      submit_flags+=" --environment_config $host:$worker_pool_port"
    fi
    (( job_server_port == 0 )) || summary+=", job server $host:$job_server_port"
    itt_log "Spark $spark_version up: $master_url, web UI http://$host:$webui_port, $summary"
    itt_log "submit with: launch/submit_spark.sh $submit_flags JOB_ARGS"
    ;;
  stop)
    if [[ ! -d "$state_dir" ]]; then
      itt_log "nothing to stop: no state dir $state_dir"
      exit 0
    fi
    do_stop
    itt_log "stopped (state dir $state_dir, master $master_url)"
    ;;
  status)
    if [[ ! -f "$ports_file" ]]; then
      echo "Spark: no cluster was started with state dir $state_dir"
      exit 1
    fi
    # Only this state dir's Master counts: another cluster may answer on the same port.
    master_pid=$(head -n 1 "$master_pidfile" 2>/dev/null || true)
    if ! overview=$(master_json 2>/dev/null); then
      echo "Spark: no Master answers at http://$host:$webui_port"
      exit 1
    fi
    if ! itt_pid_is "$master_pid" "$SPARK_MASTER_CLASS" || ! itt_port_owner "$webui_port" "$master_pid" >/dev/null; then
      echo "Spark at http://$host:$webui_port answers, but it is not this state dir's Master (state dir $state_dir): another cluster holds the port"
      exit 1
    fi
    "$(itt_python)" -c 'import json, sys
o = json.loads(sys.argv[1])
print("Spark %s: %s, %s alive Worker(s), %s cores (%s used), %d running application(s)" % (sys.argv[2],
      o.get("status"), o.get("aliveworkers"), o.get("cores"), o.get("coresused"), len(o.get("activeapps", []))))' \
      "$overview" "$master_url"
    down=()
    alive=$(alive_workers)
    (( alive >= workers )) || down+=("$((workers - alive)) of $workers Worker(s)")
    for ((i = 0; i < workers; i++)); do
      itt_pid_is "$(head -n 1 "$pid_dir/worker-$i.pid" 2>/dev/null)" "$SUPERVISOR_MARKER" \
        || down+=("the supervisor of Worker $i")
    done
    if [[ -f "$pool_pidfile" ]] && itt_pid_is "$(head -n 1 "$pool_pidfile")" "$ITT_WORKER_POOL_MARKER"; then
      echo "worker pool: running (pid $(cat "$pool_pidfile"), port $worker_pool_port)"
    else
      echo "worker pool: not running"
      (( worker_pool_port == 0 )) || down+=("the worker pool")
    fi
    if [[ -f "$job_server_pidfile" ]] && itt_pid_is "$(head -n 1 "$job_server_pidfile")" "$ITT_SPARK_JOB_SERVER_MAIN"; then
      echo "job server: running (pid $(cat "$job_server_pidfile"), port $job_server_port)"
    else
      echo "job server: not running"
      (( job_server_port == 0 )) || down+=("the job server")
    fi
    if (( ${#down[@]} )); then
      echo "down: $(IFS=,; echo "${down[*]}" | sed 's/,/, /g') (launch/spark_cluster.sh stop, then start, brings them back)"
      exit 1
    fi
    ;;
esac

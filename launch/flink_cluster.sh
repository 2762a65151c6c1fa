#!/usr/bin/env bash
# Starts, stops and reports on a real Flink cluster on loopback (JobManager + TaskManager(s) as
# separate processes) plus a Beam Python SDK worker pool for --environment_type=EXTERNAL.
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"

usage() {
  cat <<EOF
Usage: launch/flink_cluster.sh start|stop|status|fetch [options]

  start   install Flink and build Beam's job server (first run), write a loopback config, start
          a JobManager, the TaskManager(s), a Beam SDK worker pool and Beam's Flink job server;
          waits until all are ready
          and prints the submit_flink.sh flags that reach it; refuses while the state dir's
          cluster is still running
  stop    stop everything that 'start' started in the same --state_dir (safe to repeat)
  status  print the cluster overview from the REST API, the worker pool's and the job
          server's state; exits 1 when the cluster is not up or a part of it is down
          (stop and status read the ports that start saved in the state dir, unless given)
  fetch   install the Flink distribution and build Beam's Flink job server jar into the cache
          (start and submit_flink.sh do it on first use; fetch does it ahead of time)

Options (defaults in brackets):
  --flink_version V        Flink release of the cluster, X.Y.Z [$ITT_FLINK_VERSION_DEFAULT]
  --beam_runner_version V  Beam Java runner of the job server that fetch builds [$ITT_BEAM_RUNNER_VERSION_DEFAULT];
                           both defaults come from launch/flink_job_server/pom.xml
  --state_dir DIR          config, pid files and logs [\$(cache)/cluster]
  --rest_port P            JobManager REST / web UI port [8081]
  --rpc_port P             JobManager RPC port [6123]
  --worker_pool_port P     SDK worker pool port [50000]; 0 = no worker pool
  --job_server_port P      Beam's Flink job server, kept up for every job [8099]; 0 = none: then
                           submit_flink.sh starts one per job, and Beam's runner is not on the
                           cluster's classpath, so each stage starts its own SDK workers
  --taskmanagers N         TaskManager processes [1]
  --slots N                task slots per TaskManager [2]
  --taskmanager_memory M   process size of each TaskManager [2048m]
  --restart_attempts N     fixed-delay restart strategy attempts [3]; 0 disables restarts
  --restart_delay D        delay between restarts [5 s]; a killed TaskManager is known lost only
                           after two missed heartbeats (4 s): sooner, a restart deploys to it again
  --heartbeat_timeout_ms T how long a silent TaskManager is waited for [30000]
  --timeout S              seconds to wait for each service [90]
  -h, --help               this help

Everything binds 127.0.0.1. The web UI is http://127.0.0.1:<rest_port>. Needs Java 11 or 17;
fetch also needs Maven (mvn) unless \$FLINK_JOB_SERVER_JAR names a jar built elsewhere.
Cache: \${IMAGES_TO_TFRECORDS_CACHE:-\${XDG_CACHE_HOME:-\$HOME/.cache}/images-to-tfrecords}
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

flink_version=$ITT_FLINK_VERSION_DEFAULT
beam_runner_version=$ITT_BEAM_RUNNER_VERSION_DEFAULT
state_dir="$(itt_cache_dir)/cluster"
rest_port=8081
rpc_port=6123
worker_pool_port=50000
job_server_port=8099
taskmanagers=1
slots=2
tm_memory=2048m
restart_attempts=3
restart_delay="5 s"
heartbeat_timeout_ms=30000
timeout=90
given_ports=" "
while (($#)); do
  case "$1" in
    --flink_version) itt_need_value "$@"; flink_version=$2; shift 2 ;;
    --state_dir) itt_need_value "$@"; state_dir=$2; shift 2 ;;
    --rest_port) itt_need_value "$@"; rest_port=$2; given_ports+="rest_port "; shift 2 ;;
    --rpc_port) itt_need_value "$@"; rpc_port=$2; given_ports+="rpc_port "; shift 2 ;;
    --worker_pool_port) itt_need_value "$@"; worker_pool_port=$2; given_ports+="worker_pool_port "; shift 2 ;;
    --job_server_port) itt_need_value "$@"; job_server_port=$2; given_ports+="job_server_port "; shift 2 ;;
    --taskmanagers) itt_need_value "$@"; taskmanagers=$2; shift 2 ;;
    --slots) itt_need_value "$@"; slots=$2; shift 2 ;;
    --taskmanager_memory) itt_need_value "$@"; tm_memory=$2; shift 2 ;;
    --restart_attempts) itt_need_value "$@"; restart_attempts=$2; shift 2 ;;
    --restart_delay) itt_need_value "$@"; restart_delay=$2; shift 2 ;;
    --heartbeat_timeout_ms) itt_need_value "$@"; heartbeat_timeout_ms=$2; shift 2 ;;
    --timeout) itt_need_value "$@"; timeout=$2; shift 2 ;;
    --beam_runner_version) itt_need_value "$@"; beam_runner_version=$2; shift 2 ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h|--help) usage; exit 0 ;;
    *) itt_die "unknown option '$1' (see --help)" ;;
  esac
done
[[ "$flink_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || itt_die "--flink_version must be a full release X.Y.Z, e.g. $ITT_FLINK_VERSION_DEFAULT (got '$flink_version')"
[[ -n "$state_dir" ]] || itt_die "--state_dir must not be empty"
# Absolute, so that Flink's logging and a stop from another directory find the same files.
state_dir=$(realpath -m -- "$state_dir")
ports_file="$state_dir/ports"
# stop and status use the ports that start saved, unless given.
if [[ "$command" == stop || "$command" == status ]]; then
  itt_load_saved_ports "$ports_file" "$given_ports" rest_port rpc_port worker_pool_port job_server_port
fi
itt_need_port --rest_port "$rest_port"
itt_need_port --rpc_port "$rpc_port"
itt_need_port --worker_pool_port "$worker_pool_port" 0
itt_need_port --job_server_port "$job_server_port" 0
itt_need_int --taskmanagers "$taskmanagers" 1
itt_need_int --slots "$slots" 1
itt_need_int --timeout "$timeout" 1
itt_need_int --restart_attempts "$restart_attempts" 0
itt_need_int --heartbeat_timeout_ms "$heartbeat_timeout_ms" 1
rest_port=$((10#$rest_port)) rpc_port=$((10#$rpc_port)) worker_pool_port=$((10#$worker_pool_port))
job_server_port=$((10#$job_server_port))
# Each service its own port: a collision otherwise shows only after the others started.
itt_need_distinct_ports rest_port rpc_port worker_pool_port job_server_port

host=127.0.0.1
# What /proc/PID/cmdline of a process in the pid files must contain for stop to kill it.
FLINK_DAEMON_CLASSES=(org.apache.flink.runtime.entrypoint. org.apache.flink.runtime.taskexecutor.TaskManagerRunner)
conf_dir="$state_dir/conf"
log_dir="$state_dir/log"
pid_dir="$state_dir/pid"
pool_pidfile="$pid_dir/worker-pool.pid"
job_server_pidfile="$pid_dir/job-server.pid"
job_server_record=$(itt_job_server_record "$host:$rest_port")

flink_env() {
  # Flink's daemon scripts keep their pid files in FLINK_PID_DIR: one per state dir, so several
  # clusters (tests) can run side by side.
  export FLINK_HOME FLINK_CONF_DIR="$conf_dir" FLINK_LOG_DIR="$log_dir" FLINK_PID_DIR="$pid_dir"
}

# with_beam_runner JAR: Beam's runner on the daemons' classpath (see write_config), after Flink's
# own jars: the job server jar also holds the Flink 1.19.0 classes it was built against, which in
# Flink's lib/ came first and replaced the cluster's own (its REST API then said "1.19.0"). Flink's
# scripts put HADOOP_CLASSPATH last on the classpath, so every class Flink has is Flink's.
with_beam_runner() {
  export HADOOP_CLASSPATH="${HADOOP_CLASSPATH:+$HADOOP_CLASSPATH:}$1"
}

write_config() {
  local java_opts
  mkdir -p "$conf_dir" "$log_dir" "$pid_dir"
  cp "$FLINK_HOME"/conf/log4j*.properties "$FLINK_HOME"/conf/logback*.xml "$conf_dir/"
  # Java 17 needs the distribution's --add-opens flags; keep them verbatim.
  java_opts=$(sed -n 's/^ *all: *//p' "$FLINK_HOME/conf/config.yaml" | head -1)
  cat >"$conf_dir/config.yaml" <<EOF
# Written by launch/flink_cluster.sh: a loopback cluster.
env.java.opts.all: "$java_opts"
jobmanager.bind-host: $host
jobmanager.rpc.address: $host
jobmanager.rpc.port: $rpc_port
jobmanager.memory.process.size: 1024m
jobmanager.execution.failover-strategy: region
taskmanager.bind-host: $host
taskmanager.host: $host
taskmanager.numberOfTaskSlots: $slots
taskmanager.memory.process.size: $tm_memory
# A Beam job is many chained stages (listing, planning's combiners and GroupByKeys, conversion,
# finalize), each with its own network channels: Flink's default network share (10% of the
# memory, at least 64 MB) ran out of buffers at parallelism 2 ("Insufficient number of network
# buffers"). Beam's portable batch runner uses little managed memory, so move some over.
taskmanager.memory.network.fraction: 0.25
taskmanager.memory.network.min: 128mb
# What runs out is the number of buffers, not bytes: every channel of every exchange takes its
# own. Beam's exchanges carry paths and small stats (never pixels), so half-size buffers double
# the count at no memory cost; a planner with a few more GroupByKeys needed 8,705 of the 8,704
# 32 KiB buffers a 1536m TaskManager had at parallelism 2.
taskmanager.memory.segment-size: 16kb
taskmanager.memory.managed.fraction: 0.1
# Beam's gRPC data plane to the SDK workers allocates direct (off-heap) buffers in the task's
# threads; Flink reserves none for tasks by default, and a 1M-row plan died with
# "OutOfMemoryError: Direct buffer memory".
taskmanager.memory.task.off-heap.size: 256mb
$(if (( job_server_port != 0 )); then
  # Beam's runner classes come from the cluster's classpath (see with_beam_runner), not from each
  # job's copy: Beam keeps a job's SDK workers from one stage to the next
  # (--environment_cache_millis) only when its classes are loaded by Flink's own class loader, and
  # otherwise starts new Python workers for every stage. Parent-first for every class: Beam's from
  # the cluster with its dependencies (joda-time, ...) from the job's jar failed to cast.
  printf 'classloader.resolve-order: parent-first\n'
fi)
parallelism.default: 1
rest.address: $host
rest.bind-address: $host
rest.port: $rest_port
blob.server.port: 0
taskmanager.rpc.port: 0
taskmanager.data.port: 0
$(if (( restart_attempts > 0 )); then
  printf 'restart-strategy.type: fixed-delay\nrestart-strategy.fixed-delay.attempts: %s\n' "$restart_attempts"
  printf 'restart-strategy.fixed-delay.delay: %s\n' "$restart_delay"
else
  printf 'restart-strategy.type: none\n'
fi)
heartbeat.timeout: $heartbeat_timeout_ms
heartbeat.interval: 2000
# Flink's RPC and REST waits assume a quiet machine: a test run on 2 busy cores failed a job with
# Pekko's "AskTimeoutException ... after [10000 ms]" (pekko.ask.timeout, the default timeout of
# every RPC between JobManager and TaskManagers). A loopback cluster loses nothing by waiting
# longer: a killed process is still noticed by its broken connection and the heartbeat above.
pekko.ask.timeout: 60 s
pekko.lookup.timeout: 60 s
pekko.tcp.timeout: 60 s
rest.connection-timeout: 60000
rest.await-leader-timeout: 60000
io.tmp.dirs: $state_dir/tmp
EOF
  mkdir -p "$state_dir/tmp"
  printf '%s\n' "$FLINK_HOME" >"$state_dir/flink_home"
  printf 'rest_port=%s\nrpc_port=%s\nworker_pool_port=%s\njob_server_port=%s\n' \
    "$rest_port" "$rpc_port" "$worker_pool_port" "$job_server_port" >"$ports_file"
  printf '%s:%s\n' "$host" "$rest_port" >"$conf_dir/masters"
  printf '%s\n' "$host" >"$conf_dir/workers"
}

# start_job_server JAR: Beam's Flink job server for every job of this cluster. Started per job, it
# cost 5-6 s of JVM start and 6-7 s more of translation in a cold JVM before Flink saw the job.
start_job_server() {
  local pid
  setsid java -cp "$1" "$ITT_FLINK_JOB_SERVER_MAIN" --flink-master "http://$host:$rest_port" \
    --job-host "$host" --job-port "$job_server_port" --artifact-port 0 --expansion-port 0 \
    --artifacts-dir "$state_dir/artifacts" >"$log_dir/job-server.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$job_server_pidfile"
  itt_wait_port "$host" "$job_server_port" "$timeout" "$pid" || { tail -n 15 "$log_dir/job-server.log" >&2; return 1; }
  mkdir -p "$(dirname "$job_server_record")"
  printf '%s %s:%s\n' "$pid" "$host" "$job_server_port" >"$job_server_record"
}

rest_get() {
  "$(itt_python)" -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://$host:$rest_port$1"
}

wait_taskmanagers() {
  local waited=0 n
  while :; do
    n=$(rest_get /overview 2>/dev/null | "$(itt_python)" -c 'import json, sys
print(json.load(sys.stdin)["taskmanagers"])' 2>/dev/null || echo 0)
    (( n >= taskmanagers )) && return 0
    (( waited >= timeout )) && { itt_log "only $n of $taskmanagers TaskManagers registered after ${timeout}s"; return 1; }
    sleep 1
    waited=$((waited + 1))
  done
}

# live_pids: the pids in the state dir's pid files that are still this cluster's processes.
live_pids() {
  local f pid
  for f in "$pid_dir"/*.pid; do
    [[ -f "$f" ]] || continue
    while read -r pid; do
      if [[ "$f" == "$pool_pidfile" ]]; then
        itt_pid_is "$pid" "$ITT_WORKER_POOL_MARKER" && echo "$pid"
      elif [[ "$f" == "$job_server_pidfile" ]]; then
        itt_pid_is "$pid" "$ITT_FLINK_JOB_SERVER_MAIN" && echo "$pid"
      else
        itt_pid_is "$pid" "${FLINK_DAEMON_CLASSES[@]}" && echo "$pid"
      fi
    done <"$f"
  done
  return 0
}

do_stop() {
  local f pid waited=0 pids=()
  # Only pids whose command line is a Flink daemon's (or the worker pool's) are killed; a stale
  # pid file (a crash, a reboot) may name a process of someone else by now.
  itt_stop_pid "$pool_pidfile" 15 "$ITT_WORKER_POOL_MARKER" &
  # The record of our job server only: another state dir's cluster may have taken the port since.
  if [[ -f "$job_server_record" && -f "$job_server_pidfile" ]] \
      && [[ "$(cut -d' ' -f1 "$job_server_record")" == "$(head -n 1 "$job_server_pidfile")" ]]; then
    rm -f "$job_server_record"
  fi
  itt_stop_pid "$job_server_pidfile" 15 "$ITT_FLINK_JOB_SERVER_MAIN" &
  for f in "$pid_dir"/*.pid; do
    [[ -f "$f" && "$f" != "$pool_pidfile" && "$f" != "$job_server_pidfile" ]] || continue
    while read -r pid; do
      [[ -n "$pid" ]] || continue
      if itt_pid_is "$pid" "${FLINK_DAEMON_CLASSES[@]}"; then
        pids+=("$pid")
        kill -TERM "$pid" 2>/dev/null || true
      elif kill -0 "$pid" 2>/dev/null; then
        itt_log "pid $pid in $f is not a Flink process (any more); not stopped"
      fi
    done <"$f"
    rm -f "$f"
  done
  # Flink exits within seconds of SIGTERM; make sure nothing outlives 'stop'.
  for pid in ${pids[@]+"${pids[@]}"}; do
    while kill -0 "$pid" 2>/dev/null && (( waited < 20 )); do sleep 1; waited=$((waited + 1)); done
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait || true
}

# The first line of the JobManager's logs that says why it failed: a "Caused by", else an error.
jobmanager_error() {
  local logs=("$log_dir"/*standalonesession*.log "$log_dir"/*standalonesession*.out) line
  line=$(cat "${logs[@]}" 2>/dev/null | grep -m 1 'Caused by' || true)
  [[ -n "$line" ]] || line=$(cat "${logs[@]}" 2>/dev/null | grep -m 1 -E 'ERROR|Exception|Error' || true)
  printf '%s\n' "${line:0:300}"
}

case "$command" in
  fetch)
    if [[ -n "${FLINK_JOB_SERVER_JAR:-}" ]]; then itt_need_jar FLINK_JOB_SERVER_JAR "$FLINK_JOB_SERVER_JAR"; fi
    itt_need_java "Flink and its job server"
    itt_need_job_server_tools "$(itt_flink_minor "$flink_version")" "$beam_runner_version"
    FLINK_HOME=$(itt_ensure_flink_dist "$flink_version") || exit 2
    itt_log "Flink $flink_version: $FLINK_HOME"
    jar=$(itt_ensure_job_server_jar "$(itt_flink_minor "$flink_version")" "$beam_runner_version") || exit 2
    itt_log "job server jar: $jar"
    ;;
  start)
    itt_need_java "Flink"
    running=$(live_pids | tr '\n' ' ')
    [[ -z "$running" ]] \
      || itt_die "a cluster of state dir $state_dir is already running (pids ${running% }); stop it first: launch/flink_cluster.sh stop --state_dir $state_dir"
    itt_need_free_port "$host" "$rest_port" --rest_port
    itt_need_free_port "$host" "$rpc_port" --rpc_port
    (( worker_pool_port == 0 )) || itt_need_free_port "$host" "$worker_pool_port" --worker_pool_port
    (( job_server_port == 0 )) || itt_need_free_port "$host" "$job_server_port" --job_server_port
    FLINK_HOME=$(itt_ensure_flink_dist "$flink_version") || exit 2
    rm -f "$pid_dir"/*.pid  # stale ones (nothing in them runs any more, checked above)
    jar=""
    if (( job_server_port != 0 )); then
      jar=$(itt_ensure_job_server_jar "$(itt_flink_minor "$flink_version")" "$beam_runner_version") || exit 2
    fi
    write_config
    flink_env
    [[ -z "$jar" ]] || with_beam_runner "$jar"
    trap 'itt_log "start failed; stopping what was started"; do_stop' ERR
    trap 'trap - ERR; itt_log "interrupted; stopping what was started"; do_stop; exit 130' INT TERM
    "$FLINK_HOME/bin/jobmanager.sh" start >/dev/null
    jm_pid=$(tail -n 1 "$pid_dir"/*standalonesession.pid 2>/dev/null || true)
    # The REST port must be the JobManager's own (itt_wait_port checks who listens): another
    # cluster's REST API on the same port answered /overview and made a failed start look "up".
    ITT_PORT_HELD_BY=""
    if ! itt_wait_port "$host" "$rest_port" "$timeout" "$jm_pid"; then
      why=$(jobmanager_error)
      held=${ITT_PORT_HELD_BY:+port $rest_port (--rest_port) is held by $ITT_PORT_HELD_BY, not by this JobManager}
      trap - ERR
      do_stop
      itt_die "the JobManager did not come up${held:+: $held}${why:+: $why} (logs: $log_dir)"
    fi
    for ((i = 0; i < taskmanagers; i++)); do
      # Named tm-0, tm-1, ... in the REST API, in the order of the pids in the pid file.
      "$FLINK_HOME/bin/taskmanager.sh" start -D "taskmanager.resource-id=tm-$i" >/dev/null
    done
    wait_taskmanagers
    if (( worker_pool_port != 0 )); then
      itt_start_worker_pool "$host" "$worker_pool_port" "$pool_pidfile" "$log_dir/worker-pool.log"
    fi
    [[ -z "$jar" ]] || start_job_server "$jar"
    trap - ERR INT TERM
    summary="$taskmanagers TaskManager(s) x $slots slots"
    submit_flags="--flink_master $host:$rest_port"
    if (( worker_pool_port != 0 )); then
      summary+=", worker pool $host:$worker_pool_port"
      submit_flags+=" --environment_config $host:$worker_pool_port"
    else
      submit_flags+=" --environment_type DOCKER (no worker pool: --worker_pool_port 0)"
    fi
    if (( job_server_port != 0 )); then
      summary+=", job server $host:$job_server_port"
      submit_flags+=" --job_endpoint $host:$job_server_port"
    fi
    itt_log "Flink $flink_version up: web UI http://$host:$rest_port, $summary"
    itt_log "submit with: launch/submit_flink.sh $submit_flags --parallelism N (N <= $((taskmanagers * slots))) JOB_ARGS"
    ;;
  stop)
    if [[ ! -d "$state_dir" ]]; then
      itt_log "nothing to stop: no state dir $state_dir"
      exit 0
    fi
    do_stop
    itt_log "stopped (state dir $state_dir, REST port $rest_port)"
    ;;
  status)
    if ! overview=$(rest_get /overview 2>/dev/null); then
      echo "Flink: not reachable at http://$host:$rest_port"
      exit 1
    fi
    # Only this state dir's JobManager counts: another cluster may answer on the same port.
    jm_pid=$(tail -n 1 "$pid_dir"/*standalonesession.pid 2>/dev/null || true)
    if ! itt_pid_is "$jm_pid" "${FLINK_DAEMON_CLASSES[@]}" || ! itt_port_owner "$rest_port" "$jm_pid" >/dev/null; then
      echo "Flink at http://$host:$rest_port answers, but it is not this state dir's JobManager (state dir $state_dir): another cluster holds the port"
      exit 1
    fi
    echo "Flink at http://$host:$rest_port: $overview"
    # Exit 1 when a part that start started is down: a job submitted now would hang or fail.
    down=()
    [[ "$overview" =~ \"taskmanagers\":[[:space:]]*0[,}] ]] && down+=("every TaskManager")
    if [[ -f "$pool_pidfile" ]] && itt_pid_is "$(head -n 1 "$pool_pidfile")" "$ITT_WORKER_POOL_MARKER"; then
      echo "worker pool: running (pid $(cat "$pool_pidfile"), port $worker_pool_port)"
    else
      echo "worker pool: not running"
      (( worker_pool_port == 0 )) || down+=("the worker pool")
    fi
    if [[ -f "$job_server_pidfile" ]] && itt_pid_is "$(head -n 1 "$job_server_pidfile")" "$ITT_FLINK_JOB_SERVER_MAIN"; then
      echo "job server: running (pid $(cat "$job_server_pidfile"), port $job_server_port)"
    else
      echo "job server: not running"
      (( job_server_port == 0 )) || down+=("the job server")
    fi
    if (( ${#down[@]} )); then
      echo "down: $(IFS=,; echo "${down[*]}" | sed 's/,/, /g') (launch/flink_cluster.sh stop, then start, brings them back)"
      exit 1
    fi
    ;;
esac

#!/usr/bin/env bash
# Starts, stops and reports on a tf.data service on loopback: a dispatcher and N workers, each a
# separate process (python -m tfdata_readers.data_service_server, the same command a real host runs).
set -euo pipefail

ITT_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/_common.sh
source "$ITT_REPO_ROOT/launch/_common.sh"

usage() {
  cat <<EOF
Usage: launch/data_service.sh start|stop|status [options]

  start   start a dispatcher and --workers workers on 127.0.0.1, wait until all listen, and print
          the dispatcher's address (the last line of stdout: grpc://127.0.0.1:PORT); refuses while
          the state dir's service is still running
  stop    stop every process that 'start' started in the same --state_dir (safe to repeat)
  status  say which processes run and listen; exits 1 unless all of them do

Options (defaults in brackets):
  --state_dir DIR          ports, pid files, logs and the dispatcher's work dir [\$(cache)/data_service]
  --workers N              worker processes [2]
  --dispatcher_port P      [a free port]
  --worker_ports P1,P2,..  one per worker [free ports]
  --worker_timeout_ms T    a worker silent this long is lost to the dispatcher [5000]
  --timeout S              seconds to wait for each process to listen [120]
  -h, --help               this help

Each worker runs under a loop that restarts it when it dies, at the same address, as a cluster's
scheduler would: TensorFlow's readers wait for a lost worker to come back. On real hosts run
  python -m tfdata_readers.data_service_server --role dispatcher --port P --worker_addresses H1:P1,H2:P2
  python -m tfdata_readers.data_service_server --role worker --port P1 --dispatcher_address HD:P --worker_address H1:P1
(TensorFlow's servers listen on every interface; the addresses only say where to reach them.)
Python: \$PYTHON, else the active venv's (\$VIRTUAL_ENV), else .venv/bin/python, else python3.
EOF
}

command=${1:-}
[[ -n "$command" ]] || { usage >&2; exit 2; }
shift
case "$command" in
  -h|--help) usage; exit 0 ;;
  start|stop|status|_worker_loop) ;;
  *) itt_die "unknown command '$command' (expected start, stop or status)" ;;
esac

state_dir="$(itt_cache_dir)/data_service"
workers=2
dispatcher_port=""
worker_ports=""
worker_timeout_ms=5000
timeout=120
worker_index=""
while (($#)); do
  case "$1" in
    --state_dir) itt_need_value "$@"; state_dir=$2; shift 2 ;;
    --workers) itt_need_value "$@"; workers=$2; shift 2 ;;
    --dispatcher_port) itt_need_value "$@"; dispatcher_port=$2; shift 2 ;;
    --worker_ports) itt_need_value "$@"; worker_ports=$2; shift 2 ;;
    --worker_timeout_ms) itt_need_value "$@"; worker_timeout_ms=$2; shift 2 ;;
    --timeout) itt_need_value "$@"; timeout=$2; shift 2 ;;
    --index) itt_need_value "$@"; worker_index=$2; shift 2 ;;  # internal: _worker_loop
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h|--help) usage; exit 0 ;;
    *) itt_die "unknown option '$1' (see --help)" ;;
  esac
done
[[ -n "$state_dir" ]] || itt_die "--state_dir must not be empty"
state_dir=$(realpath -m -- "$state_dir")
itt_need_int --workers "$workers" 1
workers=$((10#$workers))  # "08" is eight, not an octal error
itt_need_int --worker_timeout_ms "$worker_timeout_ms" 1
itt_need_int --timeout "$timeout" 1

host=127.0.0.1
ports_file="$state_dir/ports"
pid_dir="$state_dir/pid"
log_dir="$state_dir/log"
work_dir="$state_dir/work"
# What /proc/PID/cmdline of a process in the pid files must contain for stop to kill it.
SERVER_MARKER=tfdata_readers.data_service_server
LOOP_MARKER="data_service.sh _worker_loop"

# The saved ports: dispatcher_port=P and worker_ports=P1,P2,...
read_ports() {
  local key value
  [[ -f "$ports_file" ]] || return 0
  while IFS='=' read -r key value; do
    case "$key" in
      dispatcher_port) dispatcher_port=$value ;;
      worker_ports) worker_ports=$value ;;
    esac
  done <"$ports_file"
}

# Runs one worker, and again whenever it dies (until stop kills this loop's process group). The
# worker's own pid goes to worker-I.server (status shows it; the loop's pid stays in worker-I.pid).
# The worker is told this loop's pid (--parent_pid) and stops when the loop is gone, however it
# died: a worker must never outlive its supervisor, unrestartable and unstoppable by pid file.
worker_loop() {
  local py port server=""
  read_ports
  IFS=',' read -r -a ports <<<"$worker_ports"
  port=${ports[$worker_index]}
  py="$(itt_python)"
  trap '[[ -z "$server" ]] || kill -TERM "$server" 2>/dev/null || true; rm -f "$pid_dir/worker-$worker_index.server"; exit 0' TERM INT HUP
  while :; do
    "$py" -m tfdata_readers.data_service_server --role worker --port "$port" \
      --dispatcher_address "$host:$dispatcher_port" --worker_address "$host:$port" --parent_pid $$ &
    server=$!
    echo "$server" >"$pid_dir/worker-$worker_index.server"
    wait "$server" || true
    echo "[data_service.sh] worker $worker_index (port $port, pid $server) exited; restarting it in 1 s" >&2
    sleep 1
  done
}

live_pids() {
  local f pid
  for f in "$pid_dir"/*.pid; do
    [[ -f "$f" ]] || continue
    pid=$(head -n 1 "$f")
    itt_pid_is "$pid" "$SERVER_MARKER" "$LOOP_MARKER" && echo "$pid"
  done
  return 0
}

# ours_in_group PGID: true when a live process of process group PGID is one of ours (a worker
# loop, or a server). The group's leader may be gone while its worker still runs.
ours_in_group() {
  local stat rest pid
  for stat in /proc/[0-9]*/stat; do
    rest=$(cat "$stat" 2>/dev/null) || continue
    rest=${rest##*) }
    read -r _ _ pgid _ <<<"$rest"
    [[ "$pgid" == "$1" ]] || continue
    pid=${stat#/proc/}
    pid=${pid%/stat}
    itt_pid_is "$pid" "$SERVER_MARKER" "$LOOP_MARKER" && return 0
  done
  return 1
}

# stop_group PIDFILE: SIGTERM the process group that start began with this pid (a dispatcher, or a
# worker loop and its worker), then SIGKILL whatever of it is left after 15 s (checked every 0.2 s); never a group that
# holds none of our processes (a stale pid file may name another program by now).
stop_group() {
  local pidfile=$1 pid waited=0
  [[ -f "$pidfile" ]] || return 0
  pid=$(head -n 1 "$pidfile")
  if [[ "$pid" =~ ^[0-9]+$ ]] && ours_in_group "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    while kill -0 -- "-$pid" 2>/dev/null && (( waited < 75 )); do
      sleep 0.2
      waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

do_stop() {
  local f
  # Every group at once (each process leads its own session, so a loop's group holds its worker
  # too): one after the other, stop took 7-11 s. Nothing is read any more, so the order does not matter.
  for f in "$pid_dir"/worker-*.pid "$pid_dir/dispatcher.pid"; do
    [[ -f "$f" ]] && stop_group "$f" &
  done
  wait || true
}

stop_hint="launch/data_service.sh stop --state_dir <its state dir>"

case "$command" in
  _worker_loop)
    worker_loop
    ;;
  start)
    running=$(live_pids | tr '\n' ' ')
    [[ -z "$running" ]] \
      || itt_die "a data service of state dir $state_dir is already running (pids ${running% }); stop it first: launch/data_service.sh stop --state_dir $state_dir"
    if [[ -n "$dispatcher_port" ]]; then
      itt_need_port --dispatcher_port "$dispatcher_port"
      itt_need_free_port "$host" "$dispatcher_port" --dispatcher_port "$stop_hint"
    else
      dispatcher_port=$(itt_free_port)
    fi
    if [[ -n "$worker_ports" ]]; then
      IFS=',' read -r -a ports <<<"$worker_ports"
      (( ${#ports[@]} == workers )) || itt_die "--worker_ports has ${#ports[@]} port(s) for --workers $workers"
      for port in "${ports[@]}"; do
        itt_need_port --worker_ports "$port"
        itt_need_free_port "$host" "$port" --worker_ports "$stop_hint"
      done
    else
      ports=()
      for ((i = 0; i < workers; i++)); do
        # Distinct from each other and from the dispatcher's (a free port is only free until bound).
        while :; do
          port=$(itt_free_port)
          [[ "$port" != "$dispatcher_port" && " ${ports[*]} " != *" $port "* ]] && break
        done
        ports+=("$port")
      done
      worker_ports=$(IFS=','; echo "${ports[*]}")
    fi
    # The dispatcher's journal is a previous run's (nothing of this state dir runs, checked above):
    # it remembers that run's workers at their old, random ports, and static sharding then fails
    # with "Worker ... is not in the workers list". The journal only helps a dispatcher restarted
    # alone, among the same workers, which this script never does; a fresh start begins a fresh one.
    rm -rf -- "$work_dir"
    mkdir -p "$pid_dir" "$log_dir" "$work_dir"
    rm -f "$pid_dir"/*.pid "$pid_dir"/*.server  # stale ones (nothing in them runs any more, checked above)
    printf 'dispatcher_port=%s\nworker_ports=%s\n' "$dispatcher_port" "$worker_ports" >"$ports_file"
    addresses=""
    for port in "${ports[@]}"; do addresses+="${addresses:+,}$host:$port"; done
    trap 'itt_log "start failed; stopping what was started"; do_stop' ERR
    trap 'trap - ERR; itt_log "interrupted; stopping what was started"; do_stop; exit 130' INT TERM
    py="$(itt_python)"
    # The dispatcher knows every worker up front: static (FILE) sharding deals parts by that list.
    PYTHONPATH="$ITT_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" setsid "$py" -m tfdata_readers.data_service_server \
      --role dispatcher --port "$dispatcher_port" --worker_addresses "$addresses" --work_dir "$work_dir" \
      --worker_timeout_ms "$worker_timeout_ms" >"$log_dir/dispatcher.log" 2>&1 </dev/null &
    echo $! >"$pid_dir/dispatcher.pid"
    for ((i = 0; i < workers; i++)); do
      PYTHONPATH="$ITT_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" setsid "$ITT_REPO_ROOT/launch/data_service.sh" \
        _worker_loop --state_dir "$state_dir" --index "$i" >"$log_dir/worker-$i.log" 2>&1 </dev/null &
      echo $! >"$pid_dir/worker-$i.pid"
    done
    if ! itt_wait_port "$host" "$dispatcher_port" "$timeout" "$(cat "$pid_dir/dispatcher.pid")"; then
      tail -n 5 "$log_dir/dispatcher.log" >&2
      false
    fi
    for ((i = 0; i < workers; i++)); do
      itt_wait_port "$host" "${ports[$i]}" "$timeout" "$(cat "$pid_dir/worker-$i.pid")" \
        || { tail -n 5 "$log_dir/worker-$i.log" >&2; false; }
    done
    trap - ERR INT TERM
    itt_log "tf.data service up: dispatcher $host:$dispatcher_port, $workers worker(s) on $addresses (state dir $state_dir)"
    itt_log "read with: make_dataset(..., data_service=\"grpc://$host:$dispatcher_port\") or launch/train_mirrored.py --data_service grpc://$host:$dispatcher_port"
    echo "grpc://$host:$dispatcher_port"
    ;;
  stop)
    if [[ ! -d "$state_dir" ]]; then
      itt_log "nothing to stop: no state dir $state_dir"
      exit 0
    fi
    do_stop
    itt_log "stopped (state dir $state_dir)"
    ;;
  status)
    read_ports
    [[ -n "$dispatcher_port" ]] || { echo "no data service in $state_dir"; exit 1; }
    up=1
    describe() {  # NAME PIDFILE PORT MARKER
      local pid=""
      [[ -f "$2" ]] && pid=$(head -n 1 "$2")
      # Listening means this pid holds the port: another program answering there is not ours.
      if itt_pid_is "$pid" "$4" && itt_port_owner "$3" "$pid" >/dev/null; then
        echo "$1: running (pid $pid, $host:$3)"
      else
        echo "$1: not running ($host:$3)"
        up=0
      fi
    }
    # A worker is up when its server runs and listens and its supervisor (the restart loop) runs;
    # the pid shown is the server's, the one that serves (and that a kill of the worker means).
    describe_worker() {  # INDEX PORT
      local loop="" server=""
      [[ -f "$pid_dir/worker-$1.pid" ]] && loop=$(head -n 1 "$pid_dir/worker-$1.pid")
      [[ -f "$pid_dir/worker-$1.server" ]] && server=$(head -n 1 "$pid_dir/worker-$1.server")
      itt_pid_is "$loop" "$LOOP_MARKER" || loop=""
      itt_pid_is "$server" "$SERVER_MARKER" || server=""
      if [[ -n "$loop" && -n "$server" ]] && itt_port_owner "$2" "$server" >/dev/null; then
        echo "worker $1: running (pid $server, $host:$2; supervisor pid $loop)"
      elif [[ -n "$loop" ]]; then
        echo "worker $1: not running ($host:$2); its supervisor (pid $loop) is restarting it"
        up=0
      elif [[ -n "$server" ]]; then
        echo "worker $1: unsupervised (pid $server, $host:$2): its supervisor is gone; restart the service"
        up=0
      else
        echo "worker $1: not running ($host:$2)"
        up=0
      fi
    }
    describe "dispatcher grpc://$host:$dispatcher_port" "$pid_dir/dispatcher.pid" "$dispatcher_port" "$SERVER_MARKER"
    IFS=',' read -r -a ports <<<"$worker_ports"
    for i in "${!ports[@]}"; do
      describe_worker "$i" "${ports[$i]}"
    done
    (( up )) || exit 1
    ;;
esac

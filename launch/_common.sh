# Shared helpers for the launch/ scripts: logging, the cache, ports, downloads and the worker pool.
# Sourced, never run. Every function is prefixed `itt_` (images-to-tfrecords).

# The Beam Python SDK the job is built with (its version is read from the job's Python when it
# can be; this is the fallback).
ITT_BEAM_VERSION_DEFAULT="2.77.0"

# FlinkRunner's pairing, pinned once in the job server's pom.xml and read from there: the Flink
# release of the cluster, and the Beam Java runner release its job server is built from. The
# Python SDK above drives that Java job server through Beam's portable (gRPC) API, which is
# stable across these releases; the Java runner only has to match the cluster's Flink minor.
ITT_JOB_SERVER_POM="$ITT_REPO_ROOT/launch/flink_job_server/pom.xml"
itt_pom_property() { sed -n "s:.*<$1>\([^<]*\)</$1>.*:\1:p" "$ITT_JOB_SERVER_POM" | head -1; }
ITT_FLINK_VERSION_DEFAULT=$(itt_pom_property flink.version)
ITT_BEAM_RUNNER_VERSION_DEFAULT=$(itt_pom_property beam.version)

itt_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
itt_die() { itt_log "error: $*"; exit 2; }

# itt_need_value "$@": inside an option loop, dies naming the option in $1 when no value follows
# it (the end of the arguments, or the next --option).
itt_need_value() {
  (($# >= 2)) || itt_die "$1 needs a value (see --help)"
  [[ "$2" != --* ]] || itt_die "$1 needs a value, got the option '$2' instead (see --help)"
}

# itt_need_java WHAT: dies with one line when there is no Java to run WHAT.
itt_need_java() {
  command -v java >/dev/null 2>&1 || [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]] \
    || itt_die "Java is missing: $1 needs a JDK 11 or 17 on PATH (e.g. apt-get install openjdk-17-jdk-headless, or set JAVA_HOME)"
}

# itt_need_port OPTION VALUE [MIN]: dies with one line naming OPTION unless VALUE is a TCP port
# (MIN..65535; MIN is 1 unless given, 0 where 0 means "none").
itt_need_port() {
  local min=${3:-1}
  [[ "$2" =~ ^[0-9]+$ ]] && (( 10#$2 >= min && 10#$2 <= 65535 )) \
    || itt_die "$1 must be a port number from $min to 65535 (got '$2')"
}

# itt_need_int OPTION VALUE MIN: dies with one line naming OPTION unless VALUE is a whole number >= MIN.
itt_need_int() {
  [[ "$2" =~ ^[0-9]+$ ]] || itt_die "$1 expected a number (got '$2')"
  (( 10#$2 >= $3 )) || itt_die "$1 must be at least $3 (got '$2')"
}

# itt_need_jar WHAT PATH: dies with one line naming WHAT (the variable or flag it came from) unless
# PATH is an existing jar (a zip: it starts with PK\x03\x04). URLs are left to Beam to download.
itt_need_jar() {
  local what=$1 jar=$2 magic
  [[ "$jar" =~ ^[a-z]+:// ]] && return 0
  [[ -f "$jar" ]] || itt_die "$what: no such file '$jar' (a Beam Flink job server jar; launch/flink_cluster.sh fetch builds one)"
  magic=$(head -c 4 -- "$jar" | od -An -tx1 | tr -d ' \n')
  [[ "$magic" == 504b0304 ]] \
    || itt_die "$what: '$jar' is not a jar (no zip header); pass Beam's Flink job server jar (launch/flink_cluster.sh fetch builds one)"
}

# itt_pid_is PID PATTERN...: true when PID is alive and its command line (/proc/PID/cmdline)
# contains one of the PATTERNs; a pid that was reused by another program is not ours to kill.
itt_pid_is() {
  local pid=$1 cmdline pattern
  shift
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  for pattern in "$@"; do
    [[ "$cmdline" == *"$pattern"* ]] && return 0
  done
  return 1
}

# itt_need_free_port HOST PORT OPTION [STOP_HINT]: dies with one line when something already listens
# there. STOP_HINT says how an earlier run of the calling script is stopped (default: Flink's).
itt_need_free_port() {
  local hint=${4:-launch/flink_cluster.sh stop}
  if itt_port_open "$1" "$2"; then
    itt_die "port $2 on $1 ($3) is in use: stop what holds it (ss -ltnp 'sport = :$2' names it; an earlier one of ours stops with $hint), or pick a free port with $3"
  fi
}

# itt_load_saved_ports FILE GIVEN KEY...: for stop and status, sets each variable KEY from the
# KEY=VALUE lines that start saved in FILE, unless GIVEN (" key1 key2 ") names it as given.
itt_load_saved_ports() {
  local file=$1 given=$2 key value
  shift 2
  [[ -f "$file" ]] || return 0
  while IFS='=' read -r key value; do
    if [[ " $* " == *" $key "* && "$given" != *" $key "* ]]; then printf -v "$key" '%s' "$value"; fi
  done <"$file"
  return 0
}

# itt_need_distinct_ports OPTION...: dies naming two options (variables of the same names) that
# hold the same port (0, "none", excepted): a collision otherwise shows only after the others started.
itt_need_distinct_ports() {
  local option port
  local -A seen=()
  for option in "$@"; do
    port=${!option}
    (( port != 0 )) || continue
    [[ -z "${seen[$port]:-}" ]] || itt_die "--${seen[$port]} and --$option are both $port: give each its own port"
    seen[$port]=$option
  done
}

# itt_environment_config TYPE CONFIG DEFAULT_POOL SDK_IMAGE: prints the --environment_config for
# --environment_type TYPE: EXTERNAL, CONFIG or DEFAULT_POOL (a worker pool's HOST:PORT); DOCKER,
# SDK_IMAGE or Beam's image for this Python and Beam; PROCESS, CONFIG (a boot command's JSON).
# Dies with one line (callers: `|| exit 2`, as it runs in a command substitution).
itt_environment_config() {
  local type=$1 config=$2 pool=$3 image=$4
  case "$type" in
    EXTERNAL)
      config=${config:-$pool}
      [[ "$config" =~ ^[^:]+:[0-9]+$ ]] \
        || itt_die "EXTERNAL needs --environment_config HOST:PORT of a worker pool (got '$config')"
      ;;
    DOCKER)
      config=${image:-$(printf 'apache/beam_python%s_sdk:%s' \
        "$("$(itt_python)" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" "$(itt_beam_version)")}
      ;;
    PROCESS)
      [[ -n "$config" ]] || itt_die "PROCESS needs --environment_config '{\"command\": \"/path/to/boot\"}'"
      ;;
    *) itt_die "--environment_type must be EXTERNAL, DOCKER or PROCESS (got '$type')" ;;
  esac
  printf '%s\n' "$config"
}

# itt_pip_files_into_cache ROOT WHAT PACKAGE...: installs PACKAGEs' files (pip --target, --no-deps:
# their Python dependencies must never enter the job's environment) into ROOT in the cache,
# replacing it only once complete, so a killed install leaves no half of one.
itt_pip_files_into_cache() {
  local root=$1 what=$2 tmp
  shift 2
  mkdir -p "$(itt_cache_dir)"
  tmp=$(mktemp -d "$(itt_cache_dir)/.$(basename "$root").XXXXXX")
  itt_log "installing $what from PyPI into $root (first run only, about a minute)"
  if ! "$(itt_python)" -m pip install --quiet --disable-pip-version-check --no-deps --target "$tmp" "$@" >&2; then
    rm -rf "$tmp"
    itt_die "could not install $* from PyPI"
  fi
  rm -rf "$root"
  mv "$tmp" "$root"
}

# Where downloads (Flink distribution, job server jar) are kept between runs.
itt_cache_dir() {
  printf '%s\n' "${IMAGES_TO_TFRECORDS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/images-to-tfrecords}"
}

# The Python that runs the job and the SDK workers: $PYTHON, else the active virtual environment's
# (as launch/ensure_venv.sh chooses), else the repo's .venv, else python3.
itt_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    printf '%s\n' "$PYTHON"
  elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    printf '%s\n' "$VIRTUAL_ENV/bin/python"
  elif [[ -x "$ITT_REPO_ROOT/.venv/bin/python" ]]; then
    printf '%s\n' "$ITT_REPO_ROOT/.venv/bin/python"
  else
    command -v python3 || itt_die "no python3 on PATH; set PYTHON=/path/to/python"
  fi
}

itt_beam_version() {
  "$(itt_python)" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null \
    || printf '%s\n' "$ITT_BEAM_VERSION_DEFAULT"
}

# "1.20.3" -> "1.20"
itt_flink_minor() { printf '%s\n' "$1" | cut -d. -f1,2; }

# Prints a TCP port that is free on 127.0.0.1 right now.
itt_free_port() {
  "$(itt_python)" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# itt_port_open HOST PORT: true when something accepts connections there.
itt_port_open() {
  "$(itt_python)" -c 'import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)' "$1" "$2"
}

# itt_port_owner PORT PID: exit 0 when a socket listening on PORT belongs to PID or one of its
# descendants (/proc/net/tcp{,6} give the socket's inode, /proc/P/fd the processes holding it);
# 1 when the listener is another process (its pid on stdout, when visible); 2 when none listens.
# A port that answers is not enough: another program (another cluster's REST API) may hold it.
ITT_PORT_OWNER_PY='import os, sys
port, root = int(sys.argv[1]), int(sys.argv[2])
inodes = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(fields[9])
if not inodes:
    sys.exit(2)
children = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            stat = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
ours, todo = set(), [root]
while todo:
    pid = todo.pop()
    if pid not in ours:
        ours.add(pid)
        todo.extend(children.get(pid, []))
def holders(pid):
    try:
        return {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()
if any(holders(pid) & inodes for pid in ours):
    sys.exit(0)
others = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in ours and holders(n) & inodes]
print(others[0] if others else "")
sys.exit(1)'

itt_port_owner() {
  "$(itt_python)" -c "$ITT_PORT_OWNER_PY" "$1" "$2"
}

# itt_wait_port HOST PORT TIMEOUT_S [PID]: waits until the port accepts connections (with PID: until
# PID, the process that should open it, or a child of it listens there); fails early if PID dies,
# and says so when another process holds the port.
itt_wait_port() {
  local host=$1 port=$2 timeout=$3 pid=${4:-} waited=0 owner="" rc
  while :; do
    if itt_port_open "$host" "$port"; then
      [[ -n "$pid" ]] || return 0
      rc=0
      owner=$(itt_port_owner "$port" "$pid") || rc=$?
      (( rc == 0 )) && return 0
      (( rc == 1 )) && owner="another process${owner:+ (pid $owner)}" || owner=""
    fi
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      itt_log "process $pid exited before $host:$port opened${owner:+; port $port is held by $owner}"
      ITT_PORT_HELD_BY=$owner
      return 1
    fi
    if (( waited >= timeout )); then
      itt_log "timed out after ${timeout}s waiting for $host:$port${owner:+; port $port is held by $owner}"
      ITT_PORT_HELD_BY=$owner
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

# itt_stop_pid PIDFILE [TIMEOUT_S [MARKER]]: SIGTERM the process group (or process) in PIDFILE,
# then SIGKILL. With MARKER, only a process whose command line contains it is stopped (else the
# pid file is stale: its pid may belong to another program by now) and the pid file is removed.
itt_stop_pid() {
  local pidfile=$1 timeout=${2:-15} marker=${3:-} pid waited=0
  [[ -f "$pidfile" ]] || return 0
  pid=$(head -n 1 "$pidfile")
  if [[ -n "$marker" ]] && ! itt_pid_is "$pid" "$marker"; then
    # (A zombie, dead but not yet reaped by its new parent, has no command line: not worth a word.)
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && [[ -s "/proc/$pid/cmdline" ]] \
      && itt_log "pid $pid in $pidfile is not ours any more; not stopped"
    pid=""
  fi
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && (( waited < timeout )); do
      sleep 1
      waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

# itt_stop_job_server: the EXIT trap of a submit script that started its own job server: stops
# the server ($job_server_pid: SIGTERM, then SIGKILL after 15 s) and removes its artifact folder
# ($job_server_artifacts); either may be empty (not started yet).
itt_stop_job_server() {
  local waited=0
  if [[ -n "${job_server_pid:-}" ]] && kill -0 "$job_server_pid" 2>/dev/null; then
    kill -TERM "$job_server_pid" 2>/dev/null || true
    while kill -0 "$job_server_pid" 2>/dev/null && (( waited < 15 )); do sleep 1; waited=$((waited + 1)); done
    kill -KILL "$job_server_pid" 2>/dev/null || true
  fi
  [[ -z "${job_server_artifacts:-}" ]] || rm -rf "$job_server_artifacts"
}

# itt_ensure_flink_dist VERSION: prints FLINK_HOME of a Flink distribution, installing it from
# PyPI's apache-flink + apache-flink-libraries (files only, --no-deps: their Python dependencies
# pin an old apache-beam and must never enter the job's environment).
itt_ensure_flink_dist() {
  local version=$1 root
  root="$(itt_cache_dir)/flink-$version"
  if [[ ! -x "$root/pyflink/bin/jobmanager.sh" || ! -f "$root/pyflink/lib/flink-dist-$version.jar" ]]; then
    command -v java >/dev/null || itt_die "Flink needs Java (11 or 17) on PATH"
    itt_pip_files_into_cache "$root" "Flink $version" "apache-flink==$version" "apache-flink-libraries==$version"
    chmod +x "$root"/pyflink/bin/*
  fi
  printf '%s\n' "$root/pyflink"
}

# itt_job_server_jar_name FLINK_MINOR BEAM_RUNNER_VERSION: the jar's file name, as Beam names it.
itt_job_server_jar_name() { printf 'beam-runners-flink-%s-job-server-%s.jar\n' "$1" "$2"; }

# itt_need_job_server_tools FLINK_MINOR BEAM_RUNNER_VERSION: dies with one line when the job server
# jar still has to be built and Java or Maven is missing (checked before any download starts).
itt_need_job_server_tools() {
  [[ -z "${FLINK_JOB_SERVER_JAR:-}" && ! -s "$(itt_cache_dir)/jars/$(itt_job_server_jar_name "$1" "$2")" ]] || return 0
  itt_need_java "building Beam's Flink job server"
  command -v mvn >/dev/null 2>&1 \
    || itt_die "Maven is missing: mvn builds Beam's Flink job server once (e.g. apt-get install maven), or pass --flink_job_server_jar PATH (or set FLINK_JOB_SERVER_JAR) to use a jar built elsewhere"
}

# itt_ensure_job_server_jar FLINK_MINOR BEAM_RUNNER_VERSION: prints the path of Beam's Flink job
# server jar. $FLINK_JOB_SERVER_JAR, when set, wins (a path, or a URL that Beam downloads itself).
# Otherwise the jar is built once into the cache from launch/flink_job_server/pom.xml: a shaded
# assembly of org.apache.beam:beam-runners-flink-<minor>:<version> and its dependencies, all from
# Maven Central (a 157 MB jar; 30 to 40 s of CPU, see docs/clusters.md; later runs reuse it).
itt_ensure_job_server_jar() {
  local minor=$1 beam=$2 name dir jar build
  if [[ -n "${FLINK_JOB_SERVER_JAR:-}" ]]; then
    printf '%s\n' "$FLINK_JOB_SERVER_JAR"
    return 0
  fi
  name=$(itt_job_server_jar_name "$minor" "$beam")
  dir="$(itt_cache_dir)/jars"
  jar="$dir/$name"
  if [[ ! -s "$jar" ]]; then
    itt_need_job_server_tools "$minor" "$beam"
    mkdir -p "$dir"
    build=$(mktemp -d "$dir/.build-$minor-$beam.XXXXXX")
    cp "$ITT_JOB_SERVER_POM" "$build/pom.xml"
    itt_log "building $name from org.apache.beam:beam-runners-flink-$minor:$beam (Maven Central) into $dir; first run only, 30 to 40 s of CPU (minutes on a busy machine)"
    if ! (cd "$build" && mvn --batch-mode --quiet "-Dflink.minor=$minor" "-Dbeam.version=$beam" package) \
        >"$build/mvn.log" 2>&1; then
      tail -n 15 "$build/mvn.log" >&2
      itt_die "Maven could not build $name (full log: $build/mvn.log); if this registry does not serve beam-runners-flink-$minor:$beam and its dependencies, pick a served pair or pass --flink_job_server_jar PATH"
    fi
    # Renamed into place only when complete, so a killed build never leaves a truncated jar.
    mv "$build/target/$name" "$jar.tmp.$$"
    mv "$jar.tmp.$$" "$jar"
    rm -rf "$build"
  fi
  printf '%s\n' "$jar"
}

# The SDK worker pool for --environment_type=EXTERNAL (launch/sdk_worker_pool.py says how it
# differs from Beam's own); its file name in /proc/PID/cmdline is how stop knows the process.
ITT_WORKER_POOL_MARKER=sdk_worker_pool.py

# itt_start_worker_pool HOST PORT PIDFILE LOGFILE: starts the pool in its own session (so that
# stopping its process group also stops its SDK workers) and waits until it listens.
itt_start_worker_pool() {
  local host=$1 port=$2 pidfile=$3 logfile=$4 py pid
  py="$(itt_python)"
  setsid "$py" "$ITT_REPO_ROOT/launch/sdk_worker_pool.py" "$host" "$port" >"$logfile" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  itt_wait_port "$host" "$port" 60 "$pid" || { tail -20 "$logfile" >&2; return 1; }
}

# Beam's Flink job server as flink_cluster.sh keeps it for its cluster: the main class names the
# process, and a file per Flink master (host_port) in the cache says where it listens, so that
# submit_flink.sh finds it from --flink_master alone, whatever the cluster's state dir.
# spark_cluster.sh keeps Spark's the same way, its records named spark-<host>_<port>.
ITT_FLINK_JOB_SERVER_MAIN=org.apache.beam.runners.flink.FlinkJobServerDriver
ITT_SPARK_JOB_SERVER_MAIN=org.apache.beam.runners.spark.SparkJobServerDriver
# itt_job_server_record HOST:PORT [PREFIX]: the record's path (PREFIX "spark-" for a Spark master).
itt_job_server_record() {
  local master=${1/#localhost:/127.0.0.1:}
  printf '%s/job-servers/%s%s\n' "$(itt_cache_dir)" "${2:-}" "${master/:/_}"
}

# itt_cluster_job_endpoint HOST:PORT [MAIN_CLASS PREFIX]: prints the endpoint of the job server
# kept for the master HOST:PORT (Flink's unless MAIN_CLASS and PREFIX say otherwise), when its
# process still runs and holds that port; fails otherwise.
itt_cluster_job_endpoint() {
  local record pid endpoint main=${2:-$ITT_FLINK_JOB_SERVER_MAIN}
  record=$(itt_job_server_record "$1" "${3:-}")
  [[ -f "$record" ]] || return 1
  read -r pid endpoint _ <"$record" || true
  [[ "$endpoint" =~ ^[^:]+:[0-9]+$ ]] || return 1
  # The recorded process must be a job server and hold the recorded port itself.
  itt_pid_is "$pid" "$main" && itt_port_owner "${endpoint##*:}" "$pid" >/dev/null || return 1
  printf '%s\n' "$endpoint"
}

# itt_need_job_service ENDPOINT START_HINT: dies with one line unless a Beam job service answers at
# ENDPOINT (HOST:PORT): nothing listening, or a port that speaks no gRPC (a web UI, a Master), would
# otherwise hang the job for minutes and end in a timeout that names nothing.
itt_need_job_service() {
  itt_port_open "${1%:*}" "${1##*:}" \
    || itt_die "nothing listens at --job_endpoint $1: $2, or leave --job_endpoint out to start one for this job"
  "$(itt_python)" -c 'import sys, grpc
try:
    grpc.channel_ready_future(grpc.insecure_channel(sys.argv[1])).result(timeout=15)
except grpc.FutureTimeoutError:
    sys.exit(1)' "$1" 2>/dev/null \
    || itt_die "no Beam job server answers at --job_endpoint $1 (gRPC, 15 s): $2, or leave --job_endpoint out to start one for this job"
}

ITT_JOB_SERVICE_MARKER=apache_beam.runners.portability.local_job_service_main

# itt_start_job_service HOST PORT PIDFILE LOGFILE: Beam's Python portable job service (it runs
# jobs with the FnApiRunner, handing work to the SDK environment that each job names).
itt_start_job_service() {
  local host=$1 port=$2 pidfile=$3 logfile=$4 py pid
  py="$(itt_python)"
  PATH="$(dirname "$py"):$PATH" setsid "$py" -m apache_beam.runners.portability.local_job_service_main \
    --port "$port" >"$logfile" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  itt_wait_port "$host" "$port" 60 "$pid" || { tail -20 "$logfile" >&2; return 1; }
}

# itt_check_job_arguments PYTHON JOB_MODULE ARGS...: for dry runs, the job's own argument checks
# (python -m beam_jobs.command_line.arguments: the parser the job runs first; no filesystem, no network).
# Passes its one line on to stderr, and exits 2 when the job would refuse the arguments.
itt_check_job_arguments() {
  local py=$1 module=$2
  shift 2
  if [[ "$module" != beam_jobs ]]; then
    itt_log "--job_module $module: its arguments are not checked (only beam_jobs' are)"
    return 0
  fi
  "$py" -m beam_jobs.command_line.arguments "$@" >&2 || exit 2
}

# Prints its arguments as one shell-quoted command line.
itt_quote_command() {
  local out="" arg
  for arg in "$@"; do out+="$(printf '%q' "$arg") "; done
  printf '%s\n' "${out% }"
}

# Flags whose values are credentials: a logged command line shows <redacted> instead.
ITT_SECRET_FLAGS_RE='^--(s3_access_key_id|s3_secret_access_key|s3_session_token)$'

# itt_quote_command_redacted ARGS...: itt_quote_command with credential values replaced, for logs.
itt_quote_command_redacted() {
  local shown=() arg hide_next=0
  for arg in "$@"; do
    if (( hide_next )); then
      shown+=("<redacted>"); hide_next=0
    elif [[ "$arg" == *=* && "${arg%%=*}" =~ $ITT_SECRET_FLAGS_RE ]]; then
      shown+=("${arg%%=*}=<redacted>")
    else
      [[ "$arg" =~ $ITT_SECRET_FLAGS_RE ]] && hide_next=1
      shown+=("$arg")
    fi
  done
  itt_quote_command "${shown[@]}"
}

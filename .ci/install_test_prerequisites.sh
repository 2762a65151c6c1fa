#!/usr/bin/env bash
# Installs or builds everything the test suite needs, before its first test; ./run_tests.sh runs it.
#
#   .ci/install_test_prerequisites.sh [venv] [chromium] [object-stores] [flink] [spark]   # default: all five
#
#   venv           the Python environment with .[test] (launch/ensure_venv.sh test)
#   chromium       a headless Chromium for the inspection report's browser test (Debian's
#                  chromium-headless-shell), unless $CHROME_BIN or one on PATH is found
#   object-stores  MinIO and fake-gcs-server, built from Go (.ci/install_object_stores.sh all)
#   flink          Flink and Beam's Flink job server jar (launch/flink_cluster.sh fetch: Java, Maven)
#   spark          Spark (PyPI's pyspark) and Beam's Spark job server jar (launch/spark_cluster.sh fetch)
#
# Go, Java, Maven and Chromium are installed with apt-get when missing, where it can (as root, or
# with sudo that asks no password). Each step has its own time limit (below), apart from the
# suite's per-test limit in pytest.ini: on a busy machine MinIO's first build alone took longer
# than one test may. The builds run beside the venv's install, so set-up takes about as long as
# its longest step (MinIO, about 10 minutes on 2 cores, once; later runs find everything cached).
#
# One line per prerequisite on stderr: where it is, or why it cannot be had. A prerequisite that
# cannot be had stops nothing: its tests fail naming it (none is ever skipped), because this
# writes the line to <name>.missing in the log folder, which the fixtures read when
# $IMAGES_TO_TFRECORDS_PREREQUISITES names that folder (./run_tests.sh sets it). Each step's
# whole output is in <name>.log there. Prints the venv's python on stdout when venv is asked for;
# exits 1 when something cannot be had.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${IMAGES_TO_TFRECORDS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/images-to-tfrecords}"
logs="$cache/test-prerequisites"

# Time limits in seconds, per step. Generous: they only bound a hung download or build.
APT_TIMEOUT_S=${APT_TIMEOUT_S:-1200}
VENV_TIMEOUT_S=${VENV_TIMEOUT_S:-2400}
OBJECT_STORES_TIMEOUT_S=${OBJECT_STORES_TIMEOUT_S:-3600}
FLINK_TIMEOUT_S=${FLINK_TIMEOUT_S:-1800}
SPARK_TIMEOUT_S=${SPARK_TIMEOUT_S:-1800}

say() { printf '[run_tests] %s\n' "$*" >&2; }

# missing NAME WHAT WHY [THEN]: the one line for a prerequisite that cannot be had, also kept for
# the fixtures; THEN says what follows (by default, that its tests fail naming it).
missing() {
  local line="$2 cannot be had: $3; ${4:-the tests that need it fail naming it}"
  printf '%s\n' "$line" >"$logs/$1.missing"
  say "$line"
}

# Go's own installer puts it in /usr/local/go/bin, which is often not on PATH.
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  PATH="$PATH:/usr/local/go/bin"
fi

have_browser() {
  [[ -n "${CHROME_BIN:-}" ]] && return 0
  local name
  for name in chromium-headless-shell chromium chromium-browser google-chrome chrome-headless-shell; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  return 1
}
have_java() { command -v java >/dev/null 2>&1 || [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; }

# go_too_old: prints the Go version when it cannot build MinIO. MinIO needs Go 1.24; from Go 1.21
# on, `go` fetches the toolchain a module names by itself (GOTOOLCHAIN=auto), older ones cannot.
go_too_old() {
  local version minor
  version=$(go env GOVERSION 2>/dev/null || true)
  [[ "$version" =~ ^go1\.([0-9]+) ]] || { printf '%s\n' "${version:-unknown}"; return 0; }
  minor=${BASH_REMATCH[1]}
  (( minor >= 21 )) && return 1
  printf '%s\n' "$version"
}

# apt_install PACKAGE...: installs Debian packages; false (with the reason in apt.log) when it cannot.
apt_install() {
  local sudo=()
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "no apt-get on this machine" >>"$logs/apt.log"
    return 1
  fi
  if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "not root, and no sudo without a password" >>"$logs/apt.log"
      return 1
    fi
  fi
  say "installing $* with apt-get (at most ${APT_TIMEOUT_S} s)"
  timeout "$APT_TIMEOUT_S" "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' apt "$@" \
      >>"$logs/apt.log" 2>&1
}

# system_packages WANTED...: installs, in one apt-get call (dpkg takes one at a time), the system
# tools the wanted steps lack.
system_packages() {
  local packages=() step
  for step in "$@"; do
    case "$step" in
      chromium) have_browser || packages+=(chromium-headless-shell) ;;
      object-stores) command -v go >/dev/null 2>&1 || packages+=(golang-go) ;;
      flink|spark)
        have_java || packages+=(openjdk-17-jdk-headless)
        [[ -n "${FLINK_JOB_SERVER_JAR:-}" ]] || command -v mvn >/dev/null 2>&1 || packages+=(maven)
        ;;
    esac
  done
  (( ${#packages[@]} )) || return 0
  apt_install "${packages[@]}" || true  # each step below says what is still missing
}

step_chromium() {
  if have_browser; then
    say "headless Chromium: ${CHROME_BIN:-$(command -v chromium-headless-shell chromium chromium-browser google-chrome chrome-headless-shell 2>/dev/null | head -n 1)}"
  else
    missing chromium "a headless Chromium (for the inspection report's browser test)" \
      "none on PATH and apt-get could not install chromium-headless-shell ($(tail -n 1 "$logs/apt.log" 2>/dev/null || echo 'see apt.log')): install it (apt-get install chromium-headless-shell) or set CHROME_BIN"
  fi
}

step_object_stores() {
  local old rc=0
  if ! command -v go >/dev/null 2>&1; then
    missing object-stores "MinIO and fake-gcs-server (for the s3:// and gs:// tests)" \
      "Go is missing and apt-get could not install it: install Go 1.21 or newer from https://go.dev/dl/ and put its bin folder on PATH"
    return
  fi
  if old=$(go_too_old); then
    missing object-stores "MinIO and fake-gcs-server (for the s3:// and gs:// tests)" \
      "$old is too old to build them (MinIO needs Go 1.24, which Go 1.21 or newer fetches by itself): install Go from https://go.dev/dl/ and put it first on PATH"
    return
  fi
  timeout "$OBJECT_STORES_TIMEOUT_S" "$repo/.ci/install_object_stores.sh" all >"$logs/object-stores.out" 2>"$logs/object-stores.log" || rc=$?
  if (( rc == 0 )); then
    say "MinIO and fake-gcs-server: built, in $cache/object-stores"
  elif (( rc == 124 )); then
    missing object-stores "MinIO and fake-gcs-server" "their build took longer than ${OBJECT_STORES_TIMEOUT_S} s (OBJECT_STORES_TIMEOUT_S; log: $logs/object-stores.log)"
  else
    missing object-stores "MinIO and fake-gcs-server" "$(grep -m 1 'error:' "$logs/object-stores.log" || tail -n 1 "$logs/object-stores.log") (log: $logs/object-stores.log)"
  fi
}

# step_engine NAME ENGINE TIMEOUT_VARIABLE: an engine's distribution and Beam's job server for it,
# through launch/<name>_cluster.sh fetch (pip installs the engine's files into the cache, never
# into the venv; Maven builds the job server jar).
step_engine() {
  local name=$1 engine=$2 limit_var=$3 rc=0 python log
  local what="$engine and Beam's $engine job server"
  log="$logs/$name.log"
  if ! have_java; then
    missing "$name" "$what (for the $engine tests)" \
      "Java is missing and apt-get could not install it: install a JDK 17 and Maven (apt-get install openjdk-17-jdk-headless maven)"
    return
  fi
  if ! python=$(pip_python); then
    missing "$name" "$what" "no Python with pip to install $engine's files (python3 -m pip, or the venv's)"
    return
  fi
  PYTHON=$python timeout "${!limit_var}" "$repo/launch/${name}_cluster.sh" fetch >"$log" 2>&1 || rc=$?
  if (( rc == 0 )); then
    say "$engine and its job server: $(sed -n 's/.*job server jar: //p' "$log" | tail -n 1)"
  elif (( rc == 124 )); then
    missing "$name" "$what" "fetching them took longer than ${!limit_var} s ($limit_var; log: $log)"
  else
    missing "$name" "$what" "$(grep -m 1 'error:' "$log" | sed 's/^\[[^]]*\] error: //' | grep . || tail -n 1 "$log") (log: $log)"
  fi
}

# A Python with pip for Flink's files: python3, else the venv's once it is ready (when it is wanted).
pip_python() {
  local waited=0
  if python3 -m pip --version >/dev/null 2>&1; then
    command -v python3
    return
  fi
  want venv || return 1
  while [[ ! -f "$logs/venv.ready" ]] && (( waited < VENV_TIMEOUT_S )); do
    [[ -f "$logs/venv.missing" ]] && return 1
    sleep 2
    waited=$((waited + 2))
  done
  cat "$logs/venv.ready"
}

wanted=("$@")
(( ${#wanted[@]} )) || wanted=(venv chromium object-stores flink spark)
for step in "${wanted[@]}"; do
  case "$step" in
    venv|chromium|object-stores|flink|spark) ;;
    *) say "error: unknown prerequisite '$step' (expected venv, chromium, object-stores, flink or spark)"; exit 2 ;;
  esac
done
mkdir -p "$logs"
rm -f "$logs"/*.missing "$logs/venv.ready" "$logs/apt.log"
want() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# Everything but the venv in the background: the system packages first (Go, Java, Maven and
# Chromium), then the builds side by side, while the venv installs in the foreground.
(
  system_packages "${wanted[@]}"
  want chromium && step_chromium
  if want object-stores; then step_object_stores & fi
  # Flink's and Spark's job servers one after the other: each is a CPU-bound Maven build, and
  # both write to one local Maven repository.
  if want flink || want spark; then
    { if want flink; then step_engine flink Flink FLINK_TIMEOUT_S; fi
      if want spark; then step_engine spark Spark SPARK_TIMEOUT_S; fi; } &
  fi
  wait
) &
background=$!

python=""
if want venv; then
  rc=0
  python=$(timeout "$VENV_TIMEOUT_S" "$repo/launch/ensure_venv.sh" test 2>"$logs/venv.log") || rc=$?
  if (( rc == 0 )); then
    printf '%s\n' "$python" >"$logs/venv.ready"
    say "Python environment: $(dirname "$(dirname "$python")") (images-to-tfrecords[test])"
  else
    why=$(tail -n 1 "$logs/venv.log")
    (( rc == 124 )) && why="its install took longer than ${VENV_TIMEOUT_S} s (VENV_TIMEOUT_S)"
    missing venv "the Python environment with .[test]" "$why (log: $logs/venv.log)" "no test can run without it"
  fi
fi
wait "$background" || true
[[ -z "$python" ]] || printf '%s\n' "$python"
! compgen -G "$logs/*.missing" >/dev/null

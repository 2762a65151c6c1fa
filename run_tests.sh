#!/usr/bin/env bash
# Runs the whole test suite on any machine, a fresh one included (CI runs exactly this). First it
# installs or builds what the suite needs (.ci/install_test_prerequisites.sh: the venv, a headless
# Chromium, MinIO and fake-gcs-server, Flink and its job server; Go, Java and Maven with apt-get
# when missing), each step with its own time limit and one line saying where it is or why it
# cannot be had; then it runs pytest. Extra arguments go to pytest, e.g. ./run_tests.sh -m "not slow".
# The environment: the active virtual environment ($VIRTUAL_ENV) when there is one, else ./.venv.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${IMAGES_TO_TFRECORDS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/images-to-tfrecords}"
# What could not be had is written there, and the fixtures that need it fail with that line.
export IMAGES_TO_TFRECORDS_PREREQUISITES="$cache/test-prerequisites"
status=0
python="$("$repo/.ci/install_test_prerequisites.sh")" || status=$?
[[ -n "$python" ]] || { echo "[run_tests] error: no Python environment to run the tests in (see above)" >&2; exit 1; }
(( status == 0 )) || echo "[run_tests] running the tests; those whose prerequisite is missing will fail naming it" >&2
# Worker pools and subprocesses must find this venv's python; the fixtures, Go where the set-up found it.
export PATH="$(dirname "$python"):$PATH"
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then export PATH="$PATH:/usr/local/go/bin"; fi
cd "$repo"
exec "$python" -m pytest "$@"

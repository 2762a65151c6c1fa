#!/usr/bin/env bash
# Installs the project with its test extras into ./.venv (first run only) and runs the whole suite.
# Extra arguments go to pytest, e.g. ./run_tests.sh -m "not slow".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$("$repo/launch/ensure_venv.sh" test)"
export PATH="$(dirname "$python"):$PATH"  # Worker pools and subprocesses must find this venv's python.
cd "$repo"
exec "$python" -m pytest "$@"

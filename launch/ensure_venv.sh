#!/usr/bin/env bash
# Creates ./.venv and installs the project with its test extras, unless that is already done for
# this exact setup.py. Sourced by run_local.sh and run_tests.sh; prints the venv's python path.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.installed-$(cat "$repo/setup.py" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ ! -f "$stamp" ]; then
  echo "installing images-to-tfrecords and its dependencies into $venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip setuptools wheel >&2
  "$venv/bin/python" -m pip install --quiet -e "$repo[test]" >&2
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
echo "$venv/bin/python"

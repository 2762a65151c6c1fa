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
  # uv resolves the same versions from the same index as pip, and installs them about 8x faster
  # (it unpacks TensorFlow's 550 MB wheel and the rest in parallel): 32 s against pip's 254 s
  # on 2 cores from an empty cache. VENV_INSTALLER=pip keeps to pip; so does a failed uv install.
  installer="${VENV_INSTALLER:-uv}"
  if [ "$installer" = uv ] && ! "$venv/bin/python" -m pip install --quiet uv >&2; then
    echo "could not install uv: installing with pip instead" >&2
    installer=pip
  fi
  if [ "$installer" = uv ]; then
    # uv reads no pip.conf: an index that pip is told about through the environment is passed on.
    index_args=()
    [ -n "${PIP_INDEX_URL:-}" ] && index_args+=(--index-url "$PIP_INDEX_URL")
    for url in ${PIP_EXTRA_INDEX_URL:-}; do index_args+=(--extra-index-url "$url"); done
    "$venv/bin/python" -m uv pip install --quiet --python "$venv/bin/python" ${index_args[@]+"${index_args[@]}"} -e "$repo[test]" >&2
  else
    "$venv/bin/python" -m pip install --quiet -e "$repo[test]" >&2
  fi
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
echo "$venv/bin/python"

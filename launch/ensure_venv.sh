#!/usr/bin/env bash
# Installs the project with the extras named (default: test) into one environment, unless that,
# or the test extras (which hold every other), is already installed there for this exact setup.py,
# at the versions launch/tested-versions.txt pins (the ones the suite last passed with).
# The environment: $VENV when set, else the virtual environment that is active ($VIRTUAL_ENV: the
# one a user made for the README's Install section, which then serves these scripts too, with
# what is missing installed into it), else ./.venv, created on first use.
#
#   launch/ensure_venv.sh samples   # run_local.sh: converting and the sample photos (about 0.8 GB)
#   launch/ensure_venv.sh test      # run_tests.sh and CI: everything the tests need (about 3.4 GB)
#
# Prints the environment's python path; says on stderr which environment it is when it installs.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-${VIRTUAL_ENV:-$repo/.venv}}"
python="${PYTHON:-python3}"
extras="${1:-test}"
# The stamp names setup.py and the tested versions: a change to either installs again.
constraints="$repo/launch/tested-versions.txt"
setup_hash="$(cat "$repo/setup.py" "$constraints" | sha256sum | cut -c1-16)"
stamp="$venv/.installed-$setup_hash-$extras"
if [ -f "$venv/.installed-$setup_hash-test" ]; then
  stamp="$venv/.installed-$setup_hash-test"
fi
if [ -z "${VENV:-}" ] && [ -n "${VIRTUAL_ENV:-}" ] && [ ! -x "$venv/bin/python" ]; then
  # A variable left over from a deleted environment: never build a new one where the user did not ask.
  echo "error: VIRTUAL_ENV=$VIRTUAL_ENV has no bin/python: activate an existing environment, or run 'deactivate' to use ./.venv" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ ! -f "$stamp" ]; then
  echo "installing images-to-tfrecords[$extras] and its dependencies into $venv (first run takes a few minutes)" >&2
  if [ "$venv" != "${VIRTUAL_ENV:-}" ]; then
    # Only a venv these scripts own gets its pip upgraded; a user's active one keeps its own.
    "$venv/bin/python" -m pip install --quiet --upgrade pip setuptools wheel >&2
  fi
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
    # --compile-bytecode, as pip does: uv leaves the .pyc files to the first import, and where
    # PYTHONDONTWRITEBYTECODE is set no import writes them, so every process compiles Beam (about
    # 4 s of CPU) and TensorFlow (about 10 s) again from source. Compiling costs about 45 s once.
    "$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" ${index_args[@]+"${index_args[@]}"} -c "$constraints" -e "$repo[$extras]" >&2
  else
    "$venv/bin/python" -m pip install --quiet -c "$constraints" -e "$repo[$extras]" >&2
  fi
  # Stamps of other setup.py versions are stale; this version's other extras are still installed.
  find "$venv" -maxdepth 1 -name '.installed-*' ! -name ".installed-$setup_hash-*" -delete
  touch "$stamp"
fi
if [ "$extras" = test ]; then
  # Model Garden's decoders, for the tests that read the records with them (see the file).
  garden_hash="$(sha256sum < "$repo/tests/modelgarden-requirements.txt" | cut -c1-16)"
  if [ ! -f "$venv/modelgarden/.installed-$garden_hash" ]; then
    echo "installing TensorFlow Model Garden's decoders into $venv/modelgarden" >&2
    rm -rf "$venv/modelgarden"
    "$venv/bin/python" -m pip install --quiet --no-deps --target "$venv/modelgarden" -r "$repo/tests/modelgarden-requirements.txt" >&2
    touch "$venv/modelgarden/.installed-$garden_hash"
  fi
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# Runs the conversion job on all local cores with Beam's FnApiRunner (no download, no cluster).
#
#   launch/run_local.sh                      # demo: builds 200 sample photos, converts them
#   launch/run_local.sh --input DIR --output_dir OUT [job flags...]
#
# It runs in the active virtual environment ($VIRTUAL_ENV) when there is one, else in ./.venv, and
# installs there, on its first run, only what converting and the sample photos need and is missing
# (about 0.8 GB in a new ./.venv; no TensorFlow: `pip install ".[read]"` adds the reader).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$("$repo/launch/ensure_venv.sh" samples)"  # converting and the sample photos only
export PATH="$(dirname "$python"):$PATH"  # Beam's worker processes must find this venv's python.
if [ "$#" -eq 0 ]; then
  samples="$repo/sample_data/photos"
  output="$repo/sample_data/tfrecords"
  if [ ! -d "$samples" ]; then
    "$python" -m beam_jobs.sample_data "$samples" --num_images 200
  fi
  set -- --input "$samples" --output_dir "$output" --splits train=0.9,validation=0.1 --overwrite
fi
exec "$python" -m beam_jobs "$@"

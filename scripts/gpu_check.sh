#!/usr/bin/env bash
# The GPU check on a ROCm or CUDA machine, offline: install the tool from a directory of wheels, then detect,
# doctor, install, verify, a short bench, `pytest -m gpu` and our build against the hand build (at most 240 s),
# and one report in --out (scripts/gpu_check.py).
#   scripts/gpu_check.sh --wheels DIR [--out DIR] [--python PY] [--pin 0.19.5] [--bench-model 350m]
#                        [--bench-stages ddp,3] [--skip-pytest] [--skip-build-bench] [--keep-wheel] [--wheel wheel.part00]
#                        [--budget S]
# DIR comes from scripts/gpu_wheels.sh on a networked machine. Runs with the target interpreter (--python,
# default python3): the script itself needs only the standard library.
# Exit codes: 0 every step passed, 2 usage, 3 no GPU visible (nothing installed), 8 a step or check failed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

PY=python3
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --python) PY=${args[i + 1]:-} ;;
    --python=*) PY=${args[i]#--python=} ;;
  esac
done
if [[ -z $PY ]] || ! command -v "$PY" >/dev/null 2>&1; then
  echo "error: --python ${PY:-(empty)}: no such interpreter" >&2
  echo "hint: name the Python that has torch, e.g. --python python3 or --python /opt/venv/bin/python" >&2
  exit 2
fi
exec "$PY" "$HERE/gpu_check.py" "$@"

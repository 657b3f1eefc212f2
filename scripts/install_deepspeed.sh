#!/usr/bin/env bash
# One-line installer: create or reuse a venv, install mlstack-ds into it, and run
# `mlstack-ds install` there: patched DeepSpeed with ops prebuilt for this machine's GPUs.
#
#   scripts/install_deepspeed.sh [--venv DIR] [--with-torch cpu] [--] [mlstack-ds install options...]
#   e.g. scripts/install_deepspeed.sh --arch gfx1100      scripts/install_deepspeed.sh -- --dry-run
#
# --venv DIR        the environment that gets DeepSpeed (default: .venv next to this repo). It is
#                   created with --system-site-packages so a system-wide ROCm PyTorch stays visible.
#                   A venv whose torch came with ROCm as Python wheels (TheRock: `rocm[libraries]`)
#                   needs `pip install "rocm[devel]==$(DIR/bin/rocm-sdk version)"` and
#                   `DIR/bin/rocm-sdk init` first (README, "ROCm as Python wheels"); it need not be
#                   activated.
# --with-torch cpu  also install the pinned CPU build of PyTorch (torch==2.13.0+cpu) into the venv,
#                   for machines without a GPU. PyTorch is otherwise never installed behind your back:
#                   pip's unpinned `torch` is a multi-GB CUDA build, wrong for AMD GPUs.
# Never uses sudo, never prompts; safe to re-run.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"
with_torch=""
passthrough=()

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --venv) [[ $# -ge 2 ]] || { echo "error: --venv needs a directory" >&2; exit 2; }; venv=$2; shift 2 ;;
    --venv=*) venv=${1#--venv=}; shift ;;
    --with-torch) [[ $# -ge 2 ]] || { echo "error: --with-torch needs a kind (cpu)" >&2; exit 2; }; with_torch=$2; shift 2 ;;
    --with-torch=*) with_torch=${1#--with-torch=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; passthrough+=("$@"); break ;;
    *) passthrough+=("$1"); shift ;;
  esac
done

case "$with_torch" in
  ""|cpu) ;;
  *) echo "error: --with-torch $with_torch: only 'cpu' can be installed by this script" >&2
     echo "hint: for ROCm, install PyTorch from https://download.pytorch.org/whl/rocmX.Y (matching your ROCm) first" >&2
     exit 2 ;;
esac

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "error: $python not found" >&2; echo "hint: install Python >= 3.10" >&2; exit 3; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "error: $python is $("$python" -V 2>&1); mlstack-ds needs Python >= 3.10" >&2; exit 3; }

if [[ ! -x $venv/bin/python ]]; then
  echo "==> creating $venv (with system site-packages)" >&2
  "$python" -m venv --system-site-packages "$venv"
fi

# The PyTorch the venv sees already (its own or the system's): "rocm 2.5.1+rocm6.2", "cpu 2.13.0+cpu" or "".
existing_torch=$("$venv/bin/python" -c 'import torch
print("rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu", torch.__version__)' 2>/dev/null || true)
if [[ $with_torch == cpu && -n $existing_torch && $existing_torch != cpu* ]]; then
  # Checked before anything is installed: a CPU torch in the venv would shadow the GPU one.
  echo "error: the venv already sees a ${existing_torch%% *} PyTorch (${existing_torch#* }); --with-torch cpu would shadow it with a CPU build" >&2
  echo "hint: leave out --with-torch cpu: DeepSpeed is then built for the PyTorch you have" >&2
  exit 2
fi

echo "==> installing mlstack-ds into $venv" >&2
"$venv/bin/python" -m pip install --quiet "$repo"

if [[ $with_torch == cpu ]]; then
  if [[ -n $existing_torch ]]; then
    echo "==> a CPU PyTorch is already installed: ${existing_torch#* }" >&2
  else
    # The repository's one torch pin (requirements/torch.txt), its CPU build.
    torch_cpu="$(grep -v '^#' "$repo/requirements/torch.txt")+cpu"
    echo "==> installing PyTorch (CPU build, $torch_cpu)" >&2
    "$venv/bin/python" -m pip install --quiet "$torch_cpu"
  fi
fi

# Without torch, `install` stops with the exact PyTorch index for the detected ROCm (exit 3).
exec "$venv/bin/mlstack-ds" install --python "$venv/bin/python" "${passthrough[@]}"

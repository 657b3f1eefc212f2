#!/usr/bin/env bash
# Run the test suite on a fresh machine: install what the tests need, then lint and pytest.
#   scripts/test.sh [pytest args...]
# Installs: Debian packages the tests use (git, hipcc for compile-only HIP checks, build tools with ccache, and
# sshd, pdsh, iproute2 for the two-host multi-node tests),
# a test venv (.venv-test, or $MLSTACK_TEST_VENV) with the tool, its test extras and the CPU
# PyTorch 2.13.0 from this machine's pip. Safe to re-run; never prompts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${MLSTACK_TEST_VENV:-.venv-test}
APT_PACKAGES=(git hipcc rocminfo build-essential ninja-build ccache python3-dev libaio-dev
              openssh-server openssh-client pdsh iproute2 procps util-linux
              slurmctld slurmd slurm-client munge)
# The torch pin and DeepSpeed 0.19.5's runtime requirements (the patch tests run DeepSpeed straight from a
# source tree in this venv): pip requirement files, the one place they are spelled (tests/support/pins.py).
PINS=requirements
TORCH_SPEC=${MLSTACK_TEST_TORCH:-$(grep -v '^#' "$PINS/torch.txt")}

missing_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing_apt+=("$pkg")
done
if ((${#missing_apt[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test.sh: installing Debian packages: ${missing_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing_apt[@]}" >/dev/null
  else
    echo "test.sh: missing Debian packages (${missing_apt[*]}); tests that need them will be skipped with the reason" >&2
  fi
fi

if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -e '.[test]' "$TORCH_SPEC" -r "$PINS/deepspeed-runtime.txt"

"$VENV/bin/ruff" check mlstack_ds tests scripts
# Compiles are cached with the other test downloads and builds: one cold build per source, shared by the
# tests that rebuild (and by the next run on this machine), never mixed with the user's own cache.
export CCACHE_DIR=${CCACHE_DIR:-$PWD/.cache/test/ccache}
# Two workers (pytest-xdist): much of the suite waits (on sleeps, time-outs, Slurm, ssh, pip) rather than
# computes, so a second worker fills the cores. tests/conftest.py groups what must share one process
# (the second pin, the tests that change the installed target: SERIAL_GROUP; each multi-node harness) and
# orders the groups itself (the serial group first, the target's readers last). MLSTACK_TEST_WORKERS=0: one process.
WORKERS=${MLSTACK_TEST_WORKERS:-2}
XDIST=()
if [[ $WORKERS != 0 ]]; then
  XDIST=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
# Where the time went (tests/support/run_timeline.py): each test phase's worker, span and CPU, summarised at
# the end, so a run over budget (CI's log included) says which worker and which tests made it so.
export MLSTACK_TEST_TIMELINE=${MLSTACK_TEST_TIMELINE:-$PWD/.cache/test/timeline.jsonl}
mkdir -p "$(dirname "$MLSTACK_TEST_TIMELINE")"
: >"$MLSTACK_TEST_TIMELINE"
set +e
"$VENV/bin/python" -m pytest "${XDIST[@]}" "$@"
rc=$?
"$VENV/bin/python" tests/support/run_timeline.py "$MLSTACK_TEST_TIMELINE"
set -e
if [[ $rc -eq 5 ]]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Run the whole suite (scripts/test.sh) several times on a machine made busy on purpose, the way a shared
# build host or a user's CI runner is: CPU, memory and I/O contention from stress-ng, beside pytest.
#   scripts/test_under_load.sh [--runs N] [--] [pytest args...]
# Load (override with MLSTACK_STRESS, stress-ng's own options): by default 2 CPU hogs per core, 2 workers
# cycling 2 GiB each through memory (the size of a DeepSpeed op compile), and 1 writer of 1 GiB files,
# which gave a load average of 8-10 on 2 cores, like the run issue 28 measured.
# Each run is started the way that run was: as a background job of this non-interactive shell, so it
# begins with SIGINT ignored (bash's rule for `&` jobs); the Ctrl-C tests must pass that way too.
# Logs: .cache/test/under-load/run-K.log and summary.txt. Exit 0 only if every run passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=3
if [[ ${1:-} == --runs ]]; then
  runs=${2:?--runs needs a number}
  shift 2
fi
[[ ${1:-} == -- ]] && shift
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "error: --runs $runs: must be a positive number" >&2; exit 2; }

if ! command -v stress-ng >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test_under_load.sh: installing stress-ng" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
  else
    echo "error: stress-ng is missing; hint: apt-get install stress-ng (or dnf/zypper install stress-ng)" >&2
    exit 3
  fi
fi

cores=$(nproc)
read -r -a load <<<"${MLSTACK_STRESS:---cpu $((2 * cores)) --vm 2 --vm-bytes 2G --hdd 1 --hdd-bytes 1G}"
logs=.cache/test/under-load
mkdir -p "$logs"
summary=$logs/summary.txt
: >"$summary"

stress_pid=
suite_pid=
stop_stress() {
  [[ -n $stress_pid ]] && kill -- -"$stress_pid" 2>/dev/null || true
  stress_pid=
}
# The suite runs with SIGINT ignored (above), so Ctrl-C here stops it explicitly.
trap 'stop_stress; [[ -n $suite_pid ]] && kill -TERM "$suite_pid" 2>/dev/null; exit 130' INT TERM
trap stop_stress EXIT

failed=0
for ((k = 1; k <= runs; k++)); do
  setsid stress-ng "${load[@]}" --temp-path "${TMPDIR:-/tmp}" --timeout 4h --quiet &
  stress_pid=$!
  sleep 10  # let the load build up before the suite starts
  started=$(date +%s)
  echo "test_under_load.sh: run $k of $runs under stress-ng ${load[*]} (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  set +e
  bash scripts/test.sh "$@" >"$logs/run-$k.log" 2>&1 &
  suite_pid=$!
  wait "$suite_pid"
  rc=$?
  suite_pid=
  set -e
  stop_stress
  minutes=$(( ($(date +%s) - started + 30) / 60 ))
  result=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$logs/run-$k.log" | tail -1 | tr -d '=' | xargs || true)
  line="run $k: exit $rc, $minutes min, ${result:-no pytest summary (see $logs/run-$k.log)}"
  echo "$line" | tee -a "$summary" >&2
  ((rc == 0)) || failed=$((failed + 1))
done
echo "test_under_load.sh: $((runs - failed)) of $runs runs passed; logs in $logs" | tee -a "$summary" >&2
((failed == 0))

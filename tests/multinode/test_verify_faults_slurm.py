"""Faults across the nodes of `verify --slurm`, for real, on the two-node Slurm cluster
(tests/support/slurm_cluster.py, faults from tests/support/node_faults.py): a node lost while the ranks
train, and a node ten times slower than the other.

As in tests/multinode/test_verify_faults_hostfile.py: the check is `zero1` (the cheapest that trains
across both nodes), the tests wait on the ranks' result files (Slurm's launch directory is shared, so
verify's stall rule watches them too), and S (`--timeout`) is far above the longest pause between two
reports of a healthy run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from support.cli import cli_argv
from support.node_faults import HOLD_RANK1_IN, cpu_cgroup_missing, cpu_throttled, lose_node_mid_check
from support.slurm_cluster import SlurmCluster
from support.target_env import TargetVenv
from support.two_hosts import REPO_ROOT

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target

STALL_S = 120  # verify's --timeout: the stall rule's S
# after the stall: srun's SIGTERM grace (30 s), the step's cancel (up to 120 s while a node does not answer)
CLEANUP_S = 240
SLOW_FRACTION = 0.1
LEFTOVER_BOUND = 300  # Slurm's cleanup on the node that was lost, once it answers again


def cli_env(tmpdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200", "TMPDIR": str(tmpdir)}


def verify_argv(target_venv: TargetVenv) -> list[str]:
    return ["salloc", "-N2", "--quiet", "--", *cli_argv("verify", "--slurm", "--python", target_venv.python,
                                                        "--only", "zero1", "--timeout", str(STALL_S), "--json")]


def rows(report: dict) -> list[tuple[str, str, dict]]:
    return [(c["name"], c["status"], c["ranks"]) for c in report["checks"]]


def test_a_node_lost_mid_verify_is_named_and_nothing_is_left(slurm: SlurmCluster, target_venv: TargetVenv,
                                                             tmp_path: Path) -> None:
    """Node b's link goes down once both ranks began zero1 (rank 1 held there by HOLD_RANK1_IN):
    verify ends within S s of the last report plus srun's
    teardown, its check fails naming node b, and nothing of the run is left on node a. Once the link is
    back, Slurm ends the step on node b and no job or step is left in squeue."""
    lost = slurm.nodes[1]
    proc = slurm.popen_in(slurm.login, verify_argv(target_venv),
                          env={**cli_env(tmp_path), "MLSTACK_VERIFY_TEST_FAULT": HOLD_RANK1_IN.format(check="zero1")})
    run = lose_node_mid_check(proc, lost, tmp_path, "zero1", timeout=STALL_S + CLEANUP_S + 300,
                              survivors=lambda: slurm.processes(slurm.login))
    assert run.returncode == ExitCode.VERIFY, run.stderr[-3000:]
    (check,) = json.loads(run.stdout)["checks"]
    sys.stderr.write(f"\n[node lost] verify ended {run.took_s:.0f} s after the link went down: {check['reason']}\n")
    assert check["status"] == "fail"
    assert "\n" not in check["reason"] and "mls-node-b" in check["reason"], check["reason"]
    assert run.took_s < STALL_S + CLEANUP_S, f"verify took {run.took_s:.0f} s after the link went down"
    assert run.left == [], f"processes of the run left on node a: {slurm.leftovers()}"
    assert slurm.wait_no_leftovers(LEFTOVER_BOUND) == {}
    assert slurm.wait_squeue_empty(LEFTOVER_BOUND) == []
    slurm.wait_idle()


@pytest.mark.skipif(bool(cpu_cgroup_missing()), reason=cpu_cgroup_missing() or "")
def test_a_node_ten_times_slower_passes_with_the_same_results(slurm: SlurmCluster, target_venv: TargetVenv,
                                                              tmp_path: Path) -> None:
    """Node b's slurmd, and so its slurmstepd and rank, at a tenth of one CPU: several times as long as the
    unthrottled run (measured: 82 s against 15 s; proof that the quota reached the rank), and verify
    passes with the same results. Under Slurm the stall rule already decided (the launch directory is
    shared); the fixed limits on this path (the pre-launch `ls` step's 180 s, srun's teardown) are not
    reached by a slow node."""
    quick_started = time.monotonic()
    quick = slurm.run_in(slurm.login, verify_argv(target_venv), env=cli_env(tmp_path), timeout=1800)
    quick_took = time.monotonic() - quick_started
    assert quick.returncode == 0, quick.stderr[-3000:]
    with cpu_throttled(slurm.daemons[f"slurmd-{slurm.nodes[1].name}"].pid, SLOW_FRACTION):
        started = time.monotonic()
        slow = slurm.run_in(slurm.login, verify_argv(target_venv), env=cli_env(tmp_path), timeout=3600)
        took = time.monotonic() - started
    sys.stderr.write(f"\n[slow node] {took:.0f} s throttled, {quick_took:.0f} s not\n")
    assert slow.returncode == 0, (took, slow.stderr[-3000:], slow.stdout[-3000:])
    assert rows(json.loads(slow.stdout)) == rows(json.loads(quick.stdout)) == [
        ("zero1", "pass", {"0": "pass", "1": "pass"})]
    assert took > 2 * quick_took, f"{took:.0f} s throttled, {quick_took:.0f} s not: the quota did not apply"
    assert slurm.wait_no_leftovers(120) == {}
    assert slurm.wait_squeue_empty(120) == []

"""`bench --slurm` for real: inside `salloc -N2` on the two-node Slurm cluster, a ZeRO stage on the first node
alone and then on both (`--nodes 1,2`, one srun task per rank, one rank per node): samples/s for each and the
scaling efficiency from one node to two; nothing left on either node. `--nodes` beyond the allocation and
`--nodes` without `--slurm` are usage errors."""

from __future__ import annotations

import json
import os
import sys

import pytest
from support.cli import cli_argv, run_cli
from support.slurm_cluster import SlurmCluster
from support.target_env import TargetVenv
from support.two_hosts import REPO_ROOT

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target


def bench(slurm: SlurmCluster, *args: str | os.PathLike[str]) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    out = slurm.salloc(cli_argv("bench", "--slurm", *args, "--json"), env=env, timeout=1800)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def test_bench_slurm_measures_one_node_then_two_with_scaling(slurm: SlurmCluster, target_venv: TargetVenv) -> None:
    code, report, stderr = bench(slurm, "--python", target_venv.python, "--stages", "2", "--steps", "2",
                                 "--warmup", "1", "--nodes", "1,2")
    assert code == 0, stderr[-3000:]
    one, two = report["runs"]
    assert (one["status"], one["world_size"], sorted(one["hosts"])) == ("ok", 1, ["mls-node-a"]), one
    assert (two["status"], two["world_size"], sorted(two["hosts"])) == ("ok", 2, ["mls-node-a", "mls-node-b"]), two
    assert one["samples_per_s"]["median"] > 0 and two["samples_per_s"]["median"] > 0
    base, scaling = report["scaling"]
    assert (base["world_size"], base["efficiency"]) == (1, 1.0)
    assert (scaling["world_size"], scaling["baseline_world_size"]) == (2, 1) and scaling["efficiency"] > 0
    assert "over 2 node(s)" in stderr
    sys.stderr.write(f"\n[bench --slurm] ZeRO-2 samples/s: 1 node {one['samples_per_s']['median']:.2f}, "
                     f"2 nodes {two['samples_per_s']['median']:.2f}, efficiency {scaling['efficiency']:.0%}\n")
    assert slurm.wait_no_leftovers(120) == {}


def test_nodes_beyond_the_allocation_is_a_usage_error(slurm: SlurmCluster, torch_only_python: str) -> None:
    code, report, _stderr = bench(slurm, "--python", torch_only_python, "--nodes", "1,3")
    assert code == ExitCode.USAGE
    assert report["error"]["message"] == "--nodes 3: the allocation has 2 node(s)"


def test_nodes_without_slurm_is_a_usage_error() -> None:
    result = run_cli("bench", "--nodes", "1,2", "--python", sys.executable)
    assert result.returncode == ExitCode.USAGE
    assert result.one_error()[0] == "error: --nodes needs --slurm"

"""`bench --hostfile` for real: one ZeRO stage across two hosts (network namespaces with their own sshd,
tests/support/two_hosts.py) through DeepSpeed's launcher, one rank on each; nothing left on either node."""

from __future__ import annotations

import json

import pytest
from support.target_env import TargetVenv
from support.two_hosts import TwoHosts, head_cli

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target


def test_a_zero_stage_runs_across_two_nodes(two_hosts_shared: TwoHosts, target_venv: TargetVenv) -> None:
    hosts = two_hosts_shared
    result = head_cli(hosts, "bench", "--hostfile", hosts.hostfile(1), "--python", target_venv.python, "--stages",
                      "2", "--steps", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    (run,) = report["runs"]
    assert run["status"] == "ok" and run["world_size"] == 2, run
    assert sorted(run["hosts"]) == ["mls-node-a", "mls-node-b"]
    assert all(p and p > 0 for p in run["peak_memory_bytes"]) and run["samples_per_s"]["median"] > 0
    for host in hosts.hosts:
        assert hosts.processes(host) == [], f"processes left on {host.name}"

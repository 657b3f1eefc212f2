"""`doctor --slurm` for real: inside `salloc -N2` on the two-node Slurm cluster, one srun task per node answers
the same node script `--hostfile` sends over ssh, plus what a Slurm task sees; the Slurm pitfalls are planted
the way they happen: both device masks exported into the job (Slurm's gres binding sets ROCR_VISIBLE_DEVICES
on AMD; this cluster has no GPUs, so the test exports it), no --cpus-per-task (the default), a process
holding MASTER_PORT on loopback only on the first node, the first node's name on a loopback address in the
second node's /etc/hosts. The target is DeepSpeed without prebuilt ops (no build needed: doctor only asks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli_argv
from support.slurm_cluster import SlurmCluster
from support.target_env import TargetVenv
from support.two_hosts import NETNS_ETC, REPO_ROOT

from mlstack_ds.errors import ExitCode

pytestmark = pytest.mark.slow


def doctor(slurm: SlurmCluster, python: Path, *, extra_env: dict[str, str] | None = None,
           options: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(extra_env or {})}
    out = slurm.salloc(cli_argv("doctor", "--slurm", "--python", python, "--json"), env=env, options=options)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def findings(report: dict) -> dict[str, dict]:
    return {f["rule_id"]: f for f in report["findings"]}


def test_doctor_slurm_reports_both_nodes_and_the_planted_device_and_cpu_pitfalls(
        slurm: SlurmCluster, no_ops_venv: TargetVenv) -> None:
    code, report, stderr = doctor(slurm, no_ops_venv.python,
                                  extra_env={"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"})
    assert code == 0, (stderr, report)  # warnings only
    assert [(n["host"], n["reachable"], n["hostname"]) for n in report["nodes"]] == [
        ("mls-node-a", True, "mls-node-a"), ("mls-node-b", True, "mls-node-b")]
    assert all(n["deepspeed"] and n["torch"]["version"] for n in report["nodes"])
    assert report["slurm"]["launcher"] == "srun" and report["slurm"]["rendezvous"]["host"] == "mls-node-a"
    assert [n["rendezvous_port"] for n in report["nodes"]] == ["ok", "ok"]
    found = findings(report)
    assert set(found) == {"MLS-SLURM-001", "MLS-SLURM-002"}, found
    assert found["MLS-SLURM-001"]["evidence"] == ("mls-node-a: ROCR_VISIBLE_DEVICES=0,1 and HIP_VISIBLE_DEVICES=1; "
                                                  "mls-node-b: ROCR_VISIBLE_DEVICES=0,1 and HIP_VISIBLE_DEVICES=1")
    assert "mls-node-a, mls-node-b" in found["MLS-SLURM-002"]["evidence"]
    for line in ("mls-node-a: reachable; Python", "mls-node-b: reachable; Python"):
        assert line in stderr
    assert slurm.wait_no_leftovers(120) == {}


def test_cpus_per_task_and_omp_threads_set_quiet_the_cpu_warning(slurm: SlurmCluster,
                                                                   no_ops_venv: TargetVenv) -> None:
    code, report, stderr = doctor(slurm, no_ops_venv.python, extra_env={"OMP_NUM_THREADS": "2"})
    assert code == 0, stderr
    assert "MLS-SLURM-002" not in findings(report)


def test_a_target_under_a_long_path_is_read_whole_from_every_node(
        slurm: SlurmCluster, no_ops_venv: TargetVenv, tmp_path: Path) -> None:
    """srun --label splits a task's line longer than 1024 bytes (Slurm's message size) into two labelled lines;
    the target probe's first line names the interpreter's paths several times, so a venv under a long path
    (a project directory on a cluster file system) made every node "unreadable" before the answers were
    carried in short lines."""
    deep = tmp_path / ("project-" + "d" * 180) / "environments"
    deep.mkdir(parents=True)
    (deep / "ds").symlink_to(no_ops_venv.root, target_is_directory=True)
    python = deep / "ds" / "bin" / "python"
    code, report, stderr = doctor(slurm, python, extra_env={"OMP_NUM_THREADS": "2"})
    assert code == 0, (stderr, report)
    assert [(n["host"], n["reachable"]) for n in report["nodes"]] == [("mls-node-a", True), ("mls-node-b", True)]
    assert all(n["python"]["executable"] == str(python) and n["deepspeed"] and n["torch"]["version"]
               for n in report["nodes"]), report["nodes"]
    assert slurm.wait_no_leftovers(120) == {}


def test_a_port_held_on_loopback_and_a_rendezvous_name_on_loopback_are_errors(
        slurm: SlurmCluster, no_ops_venv: TargetVenv) -> None:
    node_a, node_b = slurm.nodes
    port = 29000 + os.getpid() % 1000
    holder = slurm.popen_in(node_a, [sys.executable, "-c",
                                     "import socket, sys, time; s = socket.socket(); "
                                     f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); "
                                     "time.sleep(600)"])
    hosts_file = NETNS_ETC / node_b.netns / "hosts"
    original = hosts_file.read_text()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        hosts_file.write_text(original.replace(f"{node_a.address} {node_a.name}", f"127.0.1.1 {node_a.name}"))
        assert slurm.run_in(node_b, ["getent", "hosts", node_a.name]).stdout.split()[0] == "127.0.1.1"
        code, report, stderr = doctor(slurm, no_ops_venv.python, extra_env={"MASTER_PORT": str(port)})
    finally:
        hosts_file.write_text(original)
        holder.kill()
        holder.wait()
    assert code == ExitCode.ENVIRONMENT, stderr
    found = findings(report)
    assert found["MLS-SLURM-003"]["evidence"] == "mls-node-b: mls-node-a resolves first to loopback 127.0.1.1"
    evidence = found["MLS-SLURM-004"]["evidence"]
    assert evidence.startswith(f"a job step cannot connect to mls-node-a:{port}: this host cannot listen on port "
                               f"{port}: Address already in use; mls-node-a: ConnectionRefusedError"), evidence
    assert "mls-node-b: ConnectionRefusedError" in evidence
    assert report["slurm"]["rendezvous"]["listen_problem"] == "Address already in use"
    assert slurm.wait_no_leftovers(120) == {}


def test_doctor_slurm_outside_an_allocation_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(cli_argv("doctor", "--slurm"), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.splitlines()[0] == "error: --slurm needs a Slurm allocation: SLURM_JOB_ID is not set here"


"""`mlstack-ds install --slurm` inside `salloc -N2` on a real two-node Slurm cluster (tests/support/slurm_cluster.py).

As in test_install_hostfile.py, the wheel comes from the session's cold install (a cache hit here, so each node
installs in seconds) and the target is a copy of the installed venv with DeepSpeed uninstalled by the tool.
A shared venv (the session cluster's nodes share the file system) is installed once, by the first node; node-local
venvs (a cluster of its own whose nodes each mount their own copy of the venv at the common path) get the
wheel each, through srun; when one node fails, the node already installed is rolled back (all or nothing).
Verify is left out here (`--no-verify`): `install --slurm` then runs exactly `verify --slurm`, tested on its own
in test_slurm_verify.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from support.cli import cli_argv, run_cli
from support.slurm_cluster import SlurmCluster, slurm_cluster
from support.two_hosts import NODE_NAMES, REPO_ROOT, TwoHosts

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target


def install(slurm: SlurmCluster, venv: Path, cache: Path) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    out = slurm.salloc(cli_argv("install", "--slurm", "--python", venv / "bin" / "python", "--cache-dir", cache,
                                "--no-verify", "--json"), env=env, timeout=1800)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def by_host(document: dict) -> dict[str, dict]:
    return {n["host"]: n for n in document.get("nodes") or document["error"]["nodes"]}


def status(slurm: SlurmCluster, node_name: str, venv: Path) -> dict:
    """`status` on the node itself (its own mounts)."""
    out = slurm.run_in(slurm.node(node_name), cli_argv("status", "--python", venv / "bin" / "python", "--json"),
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_shared_venv_is_installed_once_through_srun(slurm: SlurmCluster, target: Path, warm_cache: Path) -> None:
    code, document, stderr = install(slurm, target, warm_cache)
    assert code == 0, stderr[-3000:]
    nodes = by_host(document)
    assert [(nodes[n]["action"], nodes[n]["shares_with"]) for n in NODE_NAMES] == [
        ("installed", None), ("shared", "mls-node-a")]
    assert "mls-node-b: shares the target environment with mls-node-a" in stderr
    assert status(slurm, "mls-node-b", target)["receipt"]["cache_key"] == document["plan"]["cache_key"]
    assert slurm.wait_no_leftovers(120) == {}


def test_node_local_venvs_are_installed_on_each_node_and_a_failure_rolls_back(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path,
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts, \
            slurm_cluster(tmp_path_factory.mktemp("sl"), hosts=hosts) as cluster:
        code, document, stderr = install(cluster, target, warm_cache)
        assert code == 0, stderr[-3000:]
        nodes = by_host(document)
        assert [(nodes[n]["action"], nodes[n]["shares_with"]) for n in NODE_NAMES] == [
            ("installed", None), ("installed", None)]
        for name in NODE_NAMES:  # each node's own copy of the venv has its own receipt
            assert (tmp_path / f"{name}-venv" / "share" / "mlstack-ds" / "receipt.json").is_file()
        # all or nothing: node b's venv read-only, node a is installed again (--force) and then rolled back
        for name in NODE_NAMES:
            assert run_cli("uninstall", "--python", tmp_path / f"{name}-venv" / "bin" / "python",
                           env={"PYTHONPATH": str(REPO_ROOT)}).returncode == 0
        remounted = hosts.run_on(hosts.hosts[1], ["mount", "-o", "remount,bind,ro", target])
        assert remounted.returncode == 0, remounted.stderr
        code, document, stderr = install(cluster, target, warm_cache)
        # the node's own exit code passes through: 3 (its install lock cannot be created on a read-only
        # venv), 7 where pip is the first to fail
        assert code in (ExitCode.ENVIRONMENT, ExitCode.INSTALL), stderr[-3000:]
        error = document["error"]
        assert error["message"].startswith("node mls-node-b: install failed: ")
        assert error["message"].endswith("; rolled back on mls-node-a")
        assert [(n["host"], n["action"]) for n in error["nodes"]] == [("mls-node-a", "rolled-back"),
                                                                       ("mls-node-b", "failed")]
        assert status(cluster, "mls-node-a", target)["receipt"] is None
        assert cluster.wait_no_leftovers(120) == {}


def test_offline_checks_the_bundle_on_every_node_through_srun(slurm: SlurmCluster, offline_bundle: Path,
                                                             tmp_path: Path) -> None:
    """`install --slurm --offline DIR --dry-run`: each node's own check of the bundle, one srun step each, and the
    plan from the bundle's sdist; the target is the test venv (this machine's Python, the bundle's), no install."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    out = slurm.salloc(cli_argv("install", "--slurm", "--python", sys.executable, "--cache-dir", tmp_path / "cache",
                                "--offline", offline_bundle, "--dry-run", "--json"), env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    document = json.loads(out.stdout)
    assert document["plan"]["source"] == f"offline:{offline_bundle}"
    assert [(n["host"], n["action"]) for n in document["nodes"]] == [(n, "checked") for n in NODE_NAMES]
    for name in NODE_NAMES:
        assert f"{name}: the bundle {offline_bundle} covers this install there" in out.stderr
    assert not (tmp_path / "cache").exists()  # a dry run: nothing written, not even the cache

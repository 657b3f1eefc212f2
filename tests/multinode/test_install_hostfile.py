"""`mlstack-ds install --hostfile` on two real hosts (network namespaces with sshd: tests/support/two_hosts.py).

The wheel comes from the session's cold install (`installed_target`): each test gets a copy of its cache
entry, so the head's build is a cache hit and each node installs in seconds. The target venv is a copy of
the installed target with DeepSpeed uninstalled by the tool (torch, DeepSpeed's requirements and the HF
clients stay: the namespaces have no package index, and pip must find every requirement satisfied).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from support.bundles import without_wheel
from support.two_hosts import NODE_NAMES, REPO_ROOT, TwoHosts, head_cli, node_status

from mlstack_ds import __version__
from mlstack_ds.verify.checks import select_checks

pytestmark = pytest.mark.reads_target  # installs into copies of the installed target, never into it


def install(hosts: TwoHosts, hostfile: Path, venv: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return head_cli(hosts, "install", "--hostfile", hostfile, "--python", venv / "bin" / "python", "--cache-dir",
                    cache, "--json", *extra)


def by_host(document: dict) -> dict[str, dict]:
    nodes = document.get("nodes") or document["error"]["nodes"]
    return {n["host"]: n for n in nodes}


def test_a_shared_file_system_is_installed_once(two_hosts_shared: TwoHosts, target: Path, warm_cache: Path) -> None:
    hosts = two_hosts_shared
    planned = install(hosts, hosts.hostfile(), target, warm_cache, "--dry-run")  # checks the nodes, changes nothing
    assert planned.returncode == 0, planned.stderr
    assert [(n["host"], n["action"]) for n in json.loads(planned.stdout)["nodes"]] == [
        ("mls-node-a", "checked"), ("mls-node-b", "checked")]
    assert not (target / "share" / "mlstack-ds" / "receipt.json").exists()
    result = install(hosts, hosts.hostfile(), target, warm_cache, "--no-verify")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    nodes = by_host(document)
    assert (nodes["mls-node-a"]["action"], nodes["mls-node-a"]["cache"]) == ("installed", "shared")
    assert (nodes["mls-node-b"]["action"], nodes["mls-node-b"]["shares_with"]) == ("shared", "mls-node-a")
    assert nodes["mls-node-b"]["receipt"] == nodes["mls-node-a"]["receipt"]
    key = document["plan"]["cache_key"]
    assert nodes["mls-node-a"]["receipt"]["cache_key"] == key
    for host in hosts.hosts:  # one environment, one receipt, seen from both nodes
        status = node_status(hosts, host, target / "bin" / "python")
        assert status["intact"] and status["receipt"]["cache_key"] == key
    assert "mls-node-a: ready (cpu)" in result.stderr
    assert "mls-node-b: shares the target environment with mls-node-a" in result.stderr
    assert not list(target.glob(".mlstack-ds-node-probe-*"))  # the probe files are removed


def test_node_local_venvs_get_the_wheel_copied_and_a_receipt_each(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path,
        tmp_path: Path) -> None:
    with node_local_hosts(target, first_node_only=[warm_cache], hardlinks=True) as hosts:
        result = install(hosts, hosts.hostfile(), target, warm_cache, "--no-verify")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        key = document["plan"]["cache_key"]
        nodes = by_host(document)
        assert [(nodes[n]["action"], nodes[n]["cache"], nodes[n]["shares_with"]) for n in NODE_NAMES] == [
            ("installed", "shared", None), ("installed", "copied", None)]
        for host in hosts.hosts:
            status = node_status(hosts, host, target / "bin" / "python")
            assert status["intact"] and status["receipt"]["cache_key"] == key
            assert hosts.run_on(host, ["test", "-f", status["receipt"]["wheel"]]).returncode == 0  # rollback needs it
    for name in NODE_NAMES:  # each node's own copy of the venv has its own receipt
        assert (tmp_path / f"{name}-venv" / "share" / "mlstack-ds" / "receipt.json").is_file()
    copied = tmp_path / "mls-node-b-own-0"  # node b's cache: the entry, and no half-copied leftovers
    entry = next((copied / "wheels").iterdir())
    assert entry.name == key and {p.name for p in entry.iterdir()} >= {"build.json", Path(document["wheel"]).name}
    assert not list((copied / "tmp").glob("incoming-*"))


def test_a_nodes_corrupt_cache_entry_is_replaced_by_the_heads(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path,
        tmp_path: Path) -> None:
    """Node b's own cache already holds the entry with the same wheel but a build record cut short (a full disk,
    a killed copy): the head copies its own entry over it, so node b installs, instead of "present" by the
    wheel's hash alone and node b failing on its own cache with a --rebuild hint meant for a cache of the
    head's (issue 42: a node's corrupt cache entry)."""
    (entry,) = (warm_cache / "wheels").iterdir()
    theirs = tmp_path / "mls-node-b-own-0" / "wheels" / entry.name  # node b's node-local cache (node_local_hosts)
    shutil.copytree(entry, theirs)
    (theirs / "build.json").write_text('{"source_commit": "0123', encoding="utf-8")
    with node_local_hosts(target, first_node_only=[warm_cache], hardlinks=True) as hosts:
        result = install(hosts, hosts.hostfile(), target, warm_cache, "--no-verify")
        assert result.returncode == 0, result.stderr
        nodes = by_host(json.loads(result.stdout))
        assert [(nodes[n]["action"], nodes[n]["cache"]) for n in NODE_NAMES] == [
            ("installed", "shared"), ("installed", "copied")]
    assert (theirs / "build.json").read_bytes() == (entry / "build.json").read_bytes()


def test_a_failing_node_rolls_back_the_nodes_already_installed(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts:
        node_b = hosts.hosts[1]
        remounted = hosts.run_on(node_b, ["mount", "-o", "remount,bind,ro", target])  # node b's venv copy
        assert remounted.returncode == 0, remounted.stderr
        result = install(hosts, hosts.hostfile(), target, warm_cache, "--no-verify")
        # The node's own exit code passes through: 3, its install lock cannot be made on a read-only venv
        # (before anything there changes; pip's 7 came later, before the lock existed).
        assert result.returncode == 3, result.stderr
        error = json.loads(result.stdout)["error"]
        assert error["message"].startswith("node mls-node-b: install failed: ")
        assert "Read-only file system" in error["message"]
        assert error["message"].endswith("; rolled back on mls-node-a")
        assert [(n["host"], n["action"]) for n in error["nodes"]] == [("mls-node-a", "rolled-back"),
                                                                       ("mls-node-b", "failed")]
        for host in hosts.hosts:  # both as they were: no DeepSpeed, no receipt
            status = node_status(hosts, host, target / "bin" / "python")
            assert status["receipt"] is None and status["installed"]["deepspeed_version"] is None


def test_an_unreachable_node_stops_the_run_before_anything_happens(
        two_hosts_shared: TwoHosts, bare_python: Path, tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("mls-node-a slots=1\nmls-node-gone slots=1\n")
    result = install(two_hosts_shared, hostfile, bare_python.parent.parent, tmp_path / "cache", "--no-verify")
    assert result.returncode == 3, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["message"].startswith("node mls-node-gone is not reachable over ssh: ")
    assert "ssh -o BatchMode=yes mls-node-gone hostname" in error["hint"]
    assert not (tmp_path / "cache").exists()  # nothing was built (nor installed: bare_python has no pip)


def test_a_node_without_this_tool_at_the_same_path_is_refused(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], bare_python: Path, tmp_path: Path) -> None:
    with node_local_hosts(bare_python.parent.parent, first_node_only=[REPO_ROOT]) as hosts:
        result = install(hosts, hosts.hostfile(), bare_python.parent.parent, tmp_path / "cache", "--no-verify")
    assert result.returncode == 3, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["message"].startswith(f"node mls-node-b: mlstack-ds {__version__} is not at {sys.executable} ")
    assert error["hint"] == "install mlstack-ds at the same path on every node, or on a shared file system"
    assert not (tmp_path / "cache").exists()


def test_install_then_verify_across_the_nodes(two_hosts_shared: TwoHosts, target: Path, warm_cache: Path) -> None:
    hosts = two_hosts_shared
    result = install(hosts, hosts.hostfile(), target, warm_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    report = document["verify"]
    assert report["ok"] is True, report
    assert report["world_size"] == 2
    # the whole suite ran across the nodes: every zero* check passed on both ranks, against the torch reference
    assert [c["name"] for c in report["checks"]] == [s.name for s in select_checks()]  # the defaults (not `config`)
    zero_checks = [c for c in report["checks"] if c["name"].startswith("zero")]
    assert zero_checks and all(c["status"] == "pass" and c["ranks"] == {"0": "pass", "1": "pass"}
                               for c in zero_checks), zero_checks
    assert report["nodes"] == [
        {"host": "mls-node-a", "ranks": [0], "files": "shared", "launcher": "pdsh", "failed": [], "ok": True},
        {"host": "mls-node-b", "ranks": [1], "files": "shared", "launcher": "pdsh", "failed": [], "ok": True},
    ]
    assert "mls-node-b: reachable, ranks 1, shared file system" in result.stderr  # one progress line per node


@pytest.mark.slow
def test_one_bundle_serves_the_install_on_both_nodes(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path,
        offline_bundle: Path) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts:  # a venv of its own on each node, DIR shared
        result = install(hosts, hosts.hostfile(), target, warm_cache, "--offline", offline_bundle, "--no-verify")
        assert result.returncode == 0, result.stderr[-3000:]
        document = json.loads(result.stdout)
        source = f"offline:{offline_bundle}"
        assert document["plan"]["source"] == source
        nodes = by_host(document)
        assert [nodes[n]["action"] for n in NODE_NAMES] == ["installed", "installed"]
        for host in hosts.hosts:  # each node's own install, from the bundle
            assert f"{host.name}: the bundle {offline_bundle} covers this install there" in result.stderr
            status = node_status(hosts, host, target / "bin" / "python")
            assert status["intact"] and status["receipt"]["source"] == source
            assert status["receipt"]["cache_key"] == document["plan"]["cache_key"]


@pytest.mark.slow
def test_a_bundle_that_does_not_serve_one_node_installs_nothing_on_any(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], target: Path, warm_cache: Path,
        offline_bundle: Path, tmp_path: Path) -> None:
    # node b sees, at DIR's path, a copy without hjson (node_local_hosts binds `<name>-own-0` over it there)
    removed = without_wheel(offline_bundle, tmp_path / "mls-node-b-own-0", "hjson")
    with node_local_hosts(target, first_node_only=[offline_bundle], hardlinks=True) as hosts:
        result = install(hosts, hosts.hostfile(), target, warm_cache, "--offline", offline_bundle, "--no-verify")
        assert result.returncode == 7, result.stderr[-3000:]
        error = json.loads(result.stdout)["error"]
        assert error["message"].startswith("1 of the 2 node(s) cannot install from the bundle, so nothing was "
                                           "installed on any node: node mls-node-b: the bundle in ")
        assert removed.name in error["message"] and "mls-node-a" not in error["message"]
        assert f"mlstack-ds bundle --to {offline_bundle} --python-version" in error["hint"]
        assert [(n["host"], n["action"]) for n in error["nodes"]] == [("mls-node-a", "not-run"),
                                                                       ("mls-node-b", "failed")]
        for host in hosts.hosts:  # both as they were: no DeepSpeed, no receipt
            status = node_status(hosts, host, target / "bin" / "python")
            assert status["receipt"] is None and status["installed"]["deepspeed_version"] is None


@pytest.mark.slow
def test_doctor_offline_says_what_the_bundle_covers_on_each_node(
        node_local_hosts: Callable[..., AbstractContextManager[TwoHosts]], offline_bundle: Path) -> None:
    python = Path(sys.executable)  # the test venv (this machine's Python: the bundle's), no install needed
    with node_local_hosts(first_node_only=[offline_bundle]) as hosts:  # node b sees an empty DIR
        result = head_cli(hosts, "doctor", "--hostfile", hosts.hostfile(), "--python", python, "--offline",
                          offline_bundle, "--json", timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert {host: c["covered"] for host, c in document["offline"].items()} == {"mls-node-a": True,
                                                                               "mls-node-b": False}
    (finding,) = [f for f in document["findings"] if f["rule_id"] == "MLS-BUILD-008"]
    assert finding["evidence"] == f"mls-node-b: {offline_bundle} is not a bundle there (no bundle.json at that path)"
    assert "same path" in finding["fix"][0]
    assert f"mls-node-a: bundle {offline_bundle}: covers installing " in result.stderr

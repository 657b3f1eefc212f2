"""`install --hostfile` and `install --slurm` are one sequence written against the node seam
(cluster/transport.py): here it runs over a transport that reaches its "nodes" in memory
(tests/support/memory_nodes.py), so the sequence itself (ready lines, shared environments, the cache
copied or refused, all-or-nothing) is checked with no ssh and no Slurm. The real transports are
tests/multinode's."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from support.memory_nodes import MemoryNodes

from mlstack_ds.cluster.tool import ToolRun
from mlstack_ds.cluster.transport import NodeTransport
from mlstack_ds.console import Output
from mlstack_ds.errors import EnvironmentProblem, InstallError
from mlstack_ds.install import nodes as install_nodes
from mlstack_ds.install.pipeline import InstallRequest
from mlstack_ds.verify.suite import VerifyOptions


def nodes_for_install(hosts: tuple[str, ...], prefix: Path, seeing: Mapping[str, set[str]], *,
                  failing: frozenset[str] = frozenset(), **kwargs: Any) -> MemoryNodes:
    """Nodes that see this host's "cache" and/or target environment ("env", under `prefix`) as `seeing` says,
    whose install fails on `failing`, and which have no copy of the wheel (their `sha256sum` fails)."""
    def seen(host: str, path: Path) -> bool:
        return ("env" if path.parent == prefix else "cache") in seeing.get(host, set())

    def tool(host: str, args: Sequence[str]) -> ToolRun:
        if args[0] == "install" and host in failing:
            return ToolRun(3, {"error": {"message": "read-only venv", "hint": "", "exit_code": 3}}, "")
        return ToolRun(0, {"action": "installed" if args[0] == "install" else "rolled-back",
                           "receipt": {"cache_key": "k"}}, "")

    return MemoryNodes(hosts, seen, tool, facts={"platform": "cpu", "python": {"prefix": str(prefix)}, "gpus": []},
                       exit_codes={"sha256sum": 1}, **kwargs)


@pytest.fixture
def heads_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The head's plan, cache and wheel, without detecting or building anything."""
    cache = tmp_path / "cache"
    wheel = cache / "wheels" / "k" / "deepspeed-0.19.5-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"wheel")
    prefix = tmp_path / "venv"
    prefix.mkdir()
    plan = SimpleNamespace(plan="the plan")
    monkeypatch.setattr(install_nodes, "plan_for_nodes", lambda request, facts: plan)
    monkeypatch.setattr(install_nodes, "args_for_nodes",
                        lambda plan, python, output, dry_run=False: (cache, None, ["install", "--cached-wheel", "k"]))
    monkeypatch.setattr(install_nodes, "wheel_for_nodes", lambda plan, index, output, progress: wheel)
    return SimpleNamespace(cache=cache, wheel=wheel, prefix=prefix)


def run(nodes: NodeTransport) -> tuple[Any, str]:
    err = io.StringIO()
    output = Output(out=Console(file=io.StringIO()), err=Console(file=err, width=200), json_mode=False)
    python = Path("/v/bin/python")
    outcome = install_nodes.install_on_nodes(InstallRequest(python=python, verify=False), python, nodes, output,
                                             verify=VerifyOptions(python=python))
    return outcome, err.getvalue()


def test_a_shared_environment_is_installed_once_and_an_unshared_cache_is_copied(heads_side: SimpleNamespace) -> None:
    nodes = nodes_for_install(("a", "b", "c"), heads_side.prefix, {"a": {"cache", "env"}, "b": {"env"}, "c": set()})
    outcome, said = run(nodes)
    assert [(n.host, n.action, n.cache, n.shares_with) for n in outcome.nodes] == [
        ("a", "installed", "shared", None), ("b", "shared", None, "a"), ("c", "installed", "copied", None)]
    assert "a: ready (cpu)" in said and "b: shares the target environment with a" in said
    assert ("c", "copy", "k") in nodes.calls and not any(call[:2] == ("a", "copy") for call in nodes.calls)
    assert not list(heads_side.prefix.iterdir()) and [p.name for p in heads_side.wheel.parent.iterdir()] == [
        heads_side.wheel.name]  # the probes are gone


def test_an_environment_this_host_lacks_is_not_created_to_probe_it(heads_side: SimpleNamespace) -> None:
    """The first node's prefix missing here: every node installs on its own, and nothing appears here."""
    heads_side.prefix.rmdir()
    nodes = nodes_for_install(("a", "b"), heads_side.prefix, {"a": {"cache", "env"}, "b": {"cache", "env"}})
    outcome, _said = run(nodes)
    assert [(n.host, n.action, n.shares_with) for n in outcome.nodes] == [("a", "installed", None),
                                                                          ("b", "installed", None)]
    assert not heads_side.prefix.exists()


def test_a_transport_that_copies_nothing_needs_every_node_to_see_the_cache(heads_side: SimpleNamespace) -> None:
    nodes = nodes_for_install(("a", "b"), heads_side.prefix, {"a": {"cache"}, "b": set()}, copies_files=False,
                        option="--slurm")
    with pytest.raises(EnvironmentProblem) as caught:
        run(nodes)
    assert caught.value.message == f"node(s) b do not see the wheel cache {heads_side.cache}"
    assert caught.value.hint.startswith("install --slurm installs the wheel from the cache")
    assert not any(call[1:2] == ("install",) for call in nodes.calls)  # nothing installed anywhere


def test_the_first_failure_rolls_back_what_this_run_installed(heads_side: SimpleNamespace) -> None:
    nodes = nodes_for_install(("a", "b"), heads_side.prefix, {"a": {"cache"}, "b": {"cache"}}, failing=frozenset({"b"}))
    with pytest.raises(InstallError) as caught:
        run(nodes)
    assert caught.value.message == "node b: install failed: read-only venv; rolled back on a"
    assert int(caught.value.exit_code) == 3
    assert [(n["host"], n["action"]) for n in caught.value.details["nodes"]] == [("a", "rolled-back"),
                                                                                 ("b", "failed")]
    assert ("a", "rollback", "--python", "/v/bin/python") in nodes.calls

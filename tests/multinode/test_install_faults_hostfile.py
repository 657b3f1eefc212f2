"""Faults during `mlstack-ds install --hostfile` on two real hosts (tests/support/two_hosts.py): the run is
stopped after a node is done, a node is lost mid-install, one node's disk fills up. Each ends with every node
back at its previous DeepSpeed (none: the target starts without one) and nothing of the run left running.

The wheel is a cache hit (`warm_cache`) and each node has its own copy of the venv (`node_local_hosts`), so
each node really installs. Every step is waited for by its status line in the CLI's stderr, never a sleep.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from support.cli import StreamedLines, assert_one_error
from support.node_faults import assert_disk_full_named, assert_install_interrupted, fill_node_package_dir, link_down
from support.two_hosts import TwoHosts, head_cli, node_status, start_head_cli, wait_nothing_left

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # installs into copies of the installed target

NodeLocalHosts = Callable[..., AbstractContextManager[TwoHosts]]
STEP_S = 600  # the ceiling for one step of the run on a busy machine (seconds when idle)


def install_argv(hosts: TwoHosts, venv: Path, cache: Path) -> list[str | Path]:
    return ["install", "--hostfile", hosts.hostfile(), "--python", venv / "bin" / "python", "--cache-dir", cache,
            "--no-verify"]


def assert_as_before(hosts: TwoHosts, venv: Path) -> None:
    """No DeepSpeed and no receipt on any node: as each was before the run."""
    for host in hosts.hosts:
        status = node_status(hosts, host, venv / "bin" / "python")
        assert (host.name, status["receipt"], status["installed"]["deepspeed_version"]) == (host.name, None, None)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_after_a_node_is_done_rolls_back_every_node(
        node_local_hosts: NodeLocalHosts, target: Path, warm_cache: Path, stop: signal.Signals) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts:
        cli = start_head_cli(hosts, *install_argv(hosts, target, warm_cache))
        assert cli.stderr is not None
        stderr = StreamedLines(cli.stderr)
        try:
            stderr.wait_for("mls-node-a: installed", STEP_S)  # node a done; node b's turn has begun
            cli.send_signal(stop)
            code = cli.wait(timeout=STEP_S)
        finally:
            cli.kill()
        assert_install_interrupted(code, stderr.text())
        assert wait_nothing_left(hosts) == {}  # no install, pip, ssh or sshd session of the run on either node
        assert_as_before(hosts, target)


def test_a_node_lost_mid_install_is_named_and_the_next_run_repairs_it(
        node_local_hosts: NodeLocalHosts, target: Path, warm_cache: Path) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts:
        node_b = hosts.hosts[1]
        cli = start_head_cli(hosts, *install_argv(hosts, target, warm_cache), "--json")
        assert cli.stderr is not None and cli.stdout is not None
        stderr, stdout = StreamedLines(cli.stderr), StreamedLines(cli.stdout)
        try:
            stderr.wait_for("mls-node-b: installing", STEP_S)
            with link_down(node_b):
                cli.wait(timeout=STEP_S)
                assert node_status(hosts, hosts.hosts[0], target / "bin" / "python")["receipt"] is None
        finally:
            cli.kill()
        said = stderr.text()
        assert cli.returncode == ExitCode.ENVIRONMENT, said[-3000:]
        assert_one_error(said)
        error = json.loads(stdout.text())["error"]
        assert error["message"].startswith("node mls-node-b is not reachable over ssh: "), error
        assert error["message"].endswith("; rolled back on mls-node-a"), error
        assert "once mls-node-b answers again, run the same command again" in error["hint"]
        assert [(n["host"], n["action"]) for n in error["nodes"]] == [("mls-node-a", "rolled-back"),
                                                                       ("mls-node-b", "failed")]
        # whatever node b's own install did meanwhile (it may have finished there), the next run brings both
        # nodes to one build
        assert wait_nothing_left(hosts, timeout=STEP_S) == {}
        again = head_cli(hosts, *install_argv(hosts, target, warm_cache), "--json", timeout=STEP_S * 2)
        assert again.returncode == 0, again.stderr[-3000:]
        key = json.loads(again.stdout)["plan"]["cache_key"]
        for host in hosts.hosts:
            status = node_status(hosts, host, target / "bin" / "python")
            assert status["intact"] and status["receipt"]["cache_key"] == key, (host.name, status)


def test_a_full_disk_on_one_node_is_one_line_naming_it_and_every_node_is_rolled_back(
        node_local_hosts: NodeLocalHosts, target: Path, warm_cache: Path, tmp_path: Path) -> None:
    with node_local_hosts(target, hardlinks=True) as hosts:
        node_b = hosts.hosts[1]
        fill_node_package_dir(hosts, node_b, target, tmp_path / "mls-node-b-venv")
        result = head_cli(hosts, *install_argv(hosts, target, warm_cache), "--json", timeout=STEP_S * 2)
        assert_disk_full_named(result, "mls-node-b", "mls-node-a")
        assert wait_nothing_left(hosts) == {}
        assert_as_before(hosts, target)

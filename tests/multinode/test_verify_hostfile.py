"""`verify --hostfile` for real: DeepSpeed's own launcher (pdsh over ssh) on two hosts, 1 slot each.

The hosts are network namespaces with their own sshd (tests/support/two_hosts.py); the CLI runs on the first one.
The whole suite across the nodes (every zero* check against the torch reference, as on one node) runs in
tests/multinode/test_install_hostfile.py, on the nodes `install --hostfile` has just installed. Here, the
launch mechanics, with only the `environment` check (a rendezvous and a gather, the cheapest launch):
launch files reach nodes that do not share the file system (scp) and the rank logs come back; a launch
that cannot rendezvous (both nodes keep the machine's hostname, so gloo falls back to loopback) ends at
the time-out with nothing left on any node; a SIGTERM leaves nothing either. The refusals before any
launch (an unreachable node, a missing interpreter) use targets that need no cold install (torch only;
DeepSpeed without prebuilt ops), so they run while the session's cold install builds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.cli import start_cli
from support.target_env import TargetVenv
from support.two_hosts import REPO_ROOT, TwoHosts, head_cli, scratch_dir, two_hosts

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target


def verify_json(hosts: TwoHosts, python: Path, *args: str, env: dict[str, str] | None = None,
                hostfile: Path | None = None) -> tuple[int, dict, str]:
    result = head_cli(hosts, "verify", "--hostfile", hostfile or hosts.hostfile(1), "--python", python, "--json",
                      *args, env=env)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def assert_nothing_left(hosts: TwoHosts) -> None:
    for host in hosts.hosts:
        assert hosts.processes(host) == [], f"processes left on {host.name}"


def test_launch_files_are_copied_to_nodes_that_do_not_share_them(node_local_hosts, target_venv: TargetVenv) -> None:
    """Each node has its own TMPDIR (a node-local /tmp): the worker goes there by scp, the logs come back.

    These nodes also keep the machine's hostname, as in the time-out test below, so the run passes only
    because GLOO_SOCKET_IFNAME reaches the ranks on both nodes: DeepSpeed's launcher exports only a few
    variable prefixes by itself, and verify hands it the rest through DS_ENV_FILE."""
    with node_local_hosts(own_hostnames=False) as hosts:
        scratch = scratch_dir(hosts)
        code, report, stderr = verify_json(hosts, target_venv.python, "--only", "environment",
                                           env={"TMPDIR": str(scratch), "GLOO_SOCKET_IFNAME": "mls0"})
        assert code == 0, (stderr, report)
        assert [(c["name"], c["status"], c["ranks"]) for c in report["checks"]] == [
            ("environment", "pass", {"0": "pass", "1": "pass"})]
        assert [(n["host"], n["files"]) for n in report["nodes"]] == [("mls-node-a", "shared"),
                                                                     ("mls-node-b", "copied")]
        for host in hosts.hosts:  # the copy on node b is removed, and so is the head's own directory
            listed = hosts.run_on(host, ["ls", "-A", scratch])
            assert [n for n in listed.stdout.split() if n.startswith("mlstack-verify-")] == [], host.name
        assert_nothing_left(hosts)


def test_an_unreachable_node_is_named_and_nothing_runs(two_hosts_shared: TwoHosts, torch_only_python: Path,
                                                       tmp_path: Path) -> None:
    """A third host in the hostfile whose address answers nothing: refused before any rank starts."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("mls-node-a slots=1\nmls-node-c slots=1\n")
    config = two_hosts_shared.ssh_config
    original = config.read_text()
    config.write_text("Host mls-node-c\n  HostName 10.213.77.3\n  ConnectTimeout 2\n" + original)
    try:
        code, report, stderr = verify_json(two_hosts_shared, torch_only_python, hostfile=hostfile)
    finally:
        config.write_text(original)
    assert code == ExitCode.ENVIRONMENT, stderr
    message = report["error"]["message"]
    assert message.startswith("node mls-node-c is not reachable over ssh: "), message
    assert "ssh -o BatchMode=yes mls-node-c hostname" in report["error"]["hint"]
    assert_nothing_left(two_hosts_shared)


def test_a_node_without_the_interpreter_is_named(tmp_path: Path, no_ops_venv: TargetVenv) -> None:
    empty = tmp_path / "empty-venv"
    empty.mkdir()
    with two_hosts(tmp_path / "hosts") as hosts:
        hosts.run_on(hosts.hosts[1], ["mount", "--bind", empty, no_ops_venv.root])  # in b's mount namespace only
        code, report, stderr = verify_json(hosts, no_ops_venv.python)
    assert code == ExitCode.ENVIRONMENT, stderr
    assert report["error"]["message"] == f"node mls-node-b has no interpreter at {no_ops_venv.python}"


def test_a_launch_that_cannot_meet_times_out_and_leaves_nothing_on_any_node(
        tmp_path: Path, target_venv: TargetVenv) -> None:
    """Both nodes keep this machine's hostname, which resolves to neither: gloo binds to loopback, so a rank
    fails to reach its peer (`remote=[127.0.0.1]`, after gloo's own connect time-out, when the run lasts that
    long; either rank may be first) and the other waits. Before the fix, rank 1 and its launcher kept
    running on the second node after verify gave up."""
    with two_hosts(tmp_path / "hosts", own_hostnames=False) as hosts:
        code, report, stderr = verify_json(hosts, target_venv.python, "--only", "environment", "--timeout", "45")
        assert code == ExitCode.VERIFY, stderr
        (check,) = report["checks"]
        assert check["status"] == "fail"
        # each rank either reached gloo's verdict (the loopback address it was told), or was still waiting, or
        # lost the rendezvous store when the rank that holds it (rank 0) ended on that verdict: under the
        # parallel load runs, "rank 1: DistNetworkError: Failed to recv, got 0 bytes. Connection was likely
        # closed" beside rank 0's `remote=[127.0.0.1]`
        texts = [part.split(": ", 1)[1] for part in check["reason"].split("; ")]
        verdict = any("remote=[127.0.0.1]" in text for text in texts)
        for text in texts:
            assert (text.startswith("timed out after 45 s") or "remote=[127.0.0.1]" in text
                    or (verdict and "Connection was likely closed" in text)), check["reason"]
        assert_nothing_left(hosts)


def test_sigterm_stops_the_ranks_on_every_node(two_hosts_shared: TwoHosts, target_venv: TargetVenv) -> None:
    """The issue's measurement: after a SIGTERM the launcher, pdsh and the ranks kept running. Now the CLI
    exits 130 and no process of the launch is left on either node. Rank 1, on the second node, hangs in
    its check (the test fault variable reaches it through the env file, like every MLSTACK_ variable)."""
    hosts = two_hosts_shared
    env = hosts.env({**os.environ, "PYTHONPATH": str(REPO_ROOT), "MLSTACK_VERIFY_TEST_FAULT": "hang:rank1:environment"})
    cli = start_cli("verify", "--hostfile", hosts.hostfile(1), "--python", target_venv.python, "--only", "environment",
                    "--json", prefix=hosts.on(hosts.hosts[0], []), base_env=env, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 180
        while not any(_is_worker(pid) for pid in hosts.processes(hosts.hosts[1])):
            assert cli.poll() is None, cli.communicate()
            assert time.monotonic() < deadline, "no rank started on the second node"
            time.sleep(0.5)
        cli.send_signal(signal.SIGTERM)
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == ExitCode.INTERRUPTED, err
    assert json.loads(out)["error"]["message"].startswith("interrupted: verify stopped")
    assert_nothing_left(hosts)


def _is_worker(pid: int) -> bool:
    try:
        return b"mlstack_verify_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False

"""The one fan-out over nodes (cluster.fanout.on_each) and the one shared-file-system probe
(remote.SharedFileProbe), the latter through a fake `ssh` on PATH that runs the command here."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from mlstack_ds.cluster import remote
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.errors import EnvironmentProblem


def slow_echo(delays: dict[str, float]):
    def answer(host: str) -> str:
        time.sleep(delays.get(host, 0.0))
        if host.startswith("bad"):
            raise EnvironmentProblem(f"{host} is bad")
        if host.startswith("bug"):
            raise ValueError(host)
        return host.upper()
    return answer


def test_answers_come_in_host_order_and_done_as_each_finishes() -> None:
    seen: list[str] = []
    answers = on_each(["slow", "fast"], slow_echo({"slow": 0.3}), done=lambda host, _a: seen.append(host))
    assert answers == ["SLOW", "FAST"]
    assert seen == ["fast", "slow"]


def test_in_order_reports_in_host_order() -> None:
    seen: list[str] = []
    on_each(["slow", "fast", "mid"], slow_echo({"slow": 0.3, "mid": 0.1}), done=lambda h, _a: seen.append(h),
            in_order=True)
    assert seen == ["slow", "fast", "mid"]


def test_nodes_run_at_once() -> None:
    """All 8 are asked at the same time (counted, not timed: a loaded machine makes any wall time slow)."""
    running, most = [0], [0]
    lock = threading.Lock()
    all_started = threading.Barrier(8, timeout=60)

    def answer(host: str) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        all_started.wait()  # breaks (an error) unless all 8 are running at once
        with lock:
            running[0] -= 1
        return host

    assert on_each([f"n{i}" for i in range(8)], answer) == [f"n{i}" for i in range(8)]
    assert most[0] == 8


def test_caught_exceptions_are_a_nodes_answer_and_the_others_still_answer() -> None:
    answers = on_each(["a", "bad1", "b"], slow_echo({}), catch=EnvironmentProblem)
    assert answers[0] == "A" and answers[2] == "B"
    assert isinstance(answers[1], EnvironmentProblem) and answers[1].message == "bad1 is bad"


def test_the_first_failure_in_host_order_is_raised_after_its_predecessors_are_reported() -> None:
    seen: list[str] = []
    with pytest.raises(ValueError, match="bug-first"):
        on_each(["ok", "bug-first", "bug-second"], slow_echo({"bug-first": 0.3, "ok": 0.1}),
                done=lambda h, _a: seen.append(h), in_order=True)
    assert seen == ["ok"]


def test_nodes_not_started_are_not_asked_after_a_failure() -> None:
    asked: list[str] = []
    lock = threading.Lock()

    def fn(host: str) -> str:
        with lock:
            asked.append(host)
        if host == "bug":
            raise ValueError(host)
        time.sleep(1.0)  # the first wave still runs when the failure is seen
        return host

    hosts = ["bug", *(f"n{i}" for i in range(remote.MAX_PARALLEL_NODES * 2))]
    with pytest.raises(ValueError):
        on_each(hosts, fn)
    assert len(asked) < len(hosts)


def test_no_hosts_no_answers() -> None:
    assert on_each([], slow_echo({})) == []


FAKE_SSH = """#!/bin/sh
# ssh -o .. -o .. HOST -- COMMAND, run here; host "down" is unreachable, host "apart" sees $REAL as $OTHER
while [ "$1" = "-o" ]; do shift 2; done
host=$1; shift; [ "$1" = "--" ] && shift
case "$host" in
  down) echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255;;
  apart) exec sh -c "$(printf '%s' "$1" | sed "s#$FAKE_SSH_REAL#$FAKE_SSH_OTHER#g")";;
esac
exec sh -c "$1"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    real, other = tmp_path / "real", tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_REAL", str(real))
    monkeypatch.setenv("FAKE_SSH_OTHER", str(other))
    return real


def test_the_ssh_transport_says_which_nodes_see_a_probe_written_here(fake_ssh: Path) -> None:
    """`SshNodes.sees`: one round trip per node, all at once; a node that shares the file system sees the probe,
    one that does not sees nothing, an unreachable one is named."""
    from mlstack_ds.cluster.hostfile import HostEntry
    from mlstack_ds.cluster.ssh_nodes import SshNodes

    probe = remote.SharedFileProbe.here(fake_ssh, "probe-")
    assert probe.path.read_text() == probe.content and probe.path.parent == fake_ssh
    nodes = SshNodes((HostEntry("near", 1), HostEntry("apart", 1)))
    assert nodes.sees([probe.path]) == {"near": frozenset({str(probe.path)}), "apart": frozenset()}
    with pytest.raises(EnvironmentProblem, match="node down is not reachable over ssh: connect to host down"):
        SshNodes((HostEntry("near", 1), HostEntry("down", 1))).sees([probe.path])
    probe.remove()
    assert not probe.path.exists()


def test_launch_preparation_over_ssh_checks_each_node_and_names_one_that_cannot_take_part(fake_ssh: Path) -> None:
    """launch/nodes.prepare over the ssh transport (the sequence itself: tests/unit/test_launch_nodes.py): the
    interpreter and the shared-file probe in one `ls -d` per node; an unreachable node is ssh's own words."""
    from mlstack_ds.cluster.hostfile import HostEntry
    from mlstack_ds.launch import nodes, ways

    launch_dir = fake_ssh / "launch"
    launch_dir.mkdir(parents=True)
    hostfile = fake_ssh / "hostfile"
    lines: list[str] = []
    ready = nodes.prepare(ways.over_hostfile(hostfile, [HostEntry("near", 2)]), Path(sys.executable), launch_dir,
                          status=lines.append)
    assert ready == [nodes.Node("near", (0, 1), True, "pdsh")]
    assert lines == ["near: reachable, ranks 0-1, shared file system"]

    three = [HostEntry("near", 1), HostEntry("down", 1), HostEntry("gone", 0)]
    with pytest.raises(EnvironmentProblem) as failed:
        nodes.prepare(ways.over_hostfile(hostfile, three), Path(sys.executable), launch_dir)
    refused = "connect to host down port 22: Connection refused"
    assert failed.value.message == f"node down is not reachable over ssh: {refused}"
    with pytest.raises(EnvironmentProblem, match="no interpreter at /nowhere/python"):
        nodes.prepare(ways.over_hostfile(hostfile, [HostEntry("near", 1)]), Path("/nowhere/python"), launch_dir)
    assert list(launch_dir.iterdir()) == []  # the probe files are removed

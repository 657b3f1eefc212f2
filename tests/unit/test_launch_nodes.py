"""A launch over several nodes is one sequence written against the node seam (launch/nodes.py,
launch/session.py): here over nodes that answer in memory (tests/support/memory_nodes.py), so the
sequence itself (each node checked in one round trip, the launch directory copied where it is not shared
or the node refused where the transport copies nothing, the copied nodes' rank files back, the run stopped
on every node, the copies removed) is checked with no ssh, no pdsh and no Slurm. The real launches are
tests/multinode's (test_verify_hostfile.py, test_bench_hostfile.py, test_slurm_verify.py, test_slurm_bench.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.memory_nodes import MemoryNodes

from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.launch import launcher, nodes
from mlstack_ds.launch.nodes import NodeLaunch
from mlstack_ds.launch.session import launch_workers, progress_visible
from mlstack_ds.patience import Patience
from mlstack_ds.worker import protocol

PYTHON = Path("/v/bin/python")


@dataclass(frozen=True)
class LocalStart:
    """Ranks started here, each by its own interpreter: rank 0 writes into the launch directory (its node
    shares it), the others into `node_b` (the copy on the node that does not), as the worker would."""

    node_b: Path
    name: str = "local"
    progress_visible: bool = False
    stops_its_ranks: bool = False

    def argv(self, python: Path, args: Sequence[str], hosts: Sequence[HostEntry], *, launch_dir: Path,
             run_id: str, env: dict[str, str]) -> list[str]:
        env["LOCAL_START_ARGV"] = "seen"
        script = ("import json, sys; from pathlib import Path\n"
                  "for rank, where in enumerate(sys.argv[1:]):\n"
                  "    Path(where).mkdir(parents=True, exist_ok=True)\n"
                  "    (Path(where) / f'rank{rank}.jsonl').write_text(json.dumps({'event': 'hello'}) + '\\n')\n")
        return [sys.executable, "-c", script, *args]

    def run(self, argv: Sequence[str], *, patience: Patience, run_id: str, env: Mapping[str, str], cwd: Path,
            progress: Callable[[], object] | None) -> launcher.LaunchOutcome:
        assert env["LOCAL_START_ARGV"] == "seen" and patience.stall_s is None and progress is None
        return launcher.run_launch(argv, patience=patience, run_id=run_id, env=env, cwd=cwd)


def launch_over(transport: MemoryNodes, hosts: Sequence[HostEntry], start: LocalStart | None = None) -> NodeLaunch:
    return NodeLaunch(transport, start or LocalStart(Path("/nowhere")), tuple(hosts))


def shared_with(*hosts: str, python_on: Sequence[str] | None = None) -> Callable[[str, Path], bool]:
    """Nodes that see the interpreter (all, or `python_on`) and, if in `hosts`, this host's launch files."""
    def seen(host: str, path: Path) -> bool:
        if path == PYTHON:
            return python_on is None or host in python_on
        return host in hosts
    return seen


def test_each_node_is_checked_in_one_round_trip_and_given_the_files_it_does_not_share(tmp_path: Path) -> None:
    transport = MemoryNodes(("a", "b"), shared_with("a"))
    lines: list[str] = []
    ready = nodes.prepare(launch_over(transport, [HostEntry("a", 2), HostEntry("b", 1), HostEntry("idle", 0)]),
                          PYTHON, tmp_path, status=lines.append)
    assert [n.to_json() for n in ready] == [
        {"host": "a", "ranks": [0, 1], "files": "shared", "launcher": "local"},
        {"host": "b", "ranks": [2], "files": "copied", "launcher": "local"}]
    assert lines == ["a: reachable, ranks 0-1, shared file system",
                     "b: reachable, ranks 2, launch files copied over memory"]
    (sees,) = [call for call in transport.calls if call[0] == "sees"]
    assert sees[1] == str(PYTHON) and Path(sees[2]).parent == tmp_path
    assert ("b", "copy", tmp_path.name) in transport.calls and ("a", "copy", tmp_path.name) not in transport.calls
    assert list(tmp_path.iterdir()) == []  # the shared-file probe is gone before anything is copied


def test_every_node_that_cannot_take_part_is_named_and_no_copy_is_left(tmp_path: Path) -> None:
    transport = MemoryNodes(("a", "b", "c"), shared_with("a", python_on=("a", "c")), copies_files=False)
    lines: list[str] = []
    with pytest.raises(EnvironmentProblem) as refused:
        nodes.prepare(launch_over(transport, [HostEntry(h, 1) for h in ("a", "b", "c")]), PYTHON, tmp_path,
                      status=lines.append)
    assert refused.value.message == (f"2 nodes cannot take part: node b has no interpreter at {PYTHON}; node c does "
                                     f"not see {tmp_path} (not a shared file system)")
    assert refused.value.hint == nodes.NO_INTERPRETER_HINT
    assert lines == ["a: reachable, ranks 0, shared file system", f"b: node b has no interpreter at {PYTHON}",
                     f"c: node c does not see {tmp_path} (not a shared file system)"]
    assert not any(call[1:2] == ("copy",) for call in transport.calls)


def test_a_copy_made_before_another_node_is_refused_is_removed(tmp_path: Path) -> None:
    transport = MemoryNodes(("a", "b"), shared_with(python_on=("a",)))
    with pytest.raises(EnvironmentProblem, match=r"^node b has no interpreter at"):
        nodes.prepare(launch_over(transport, [HostEntry("a", 1), HostEntry("b", 1)]), PYTHON, tmp_path)
    assert ("a", "copy", tmp_path.name) in transport.calls
    assert ("a", "rm", "-rf", "--", str(tmp_path)) in transport.calls


def test_an_unreachable_node_is_the_transports_error_before_anything_is_copied(tmp_path: Path) -> None:
    transport = MemoryNodes(("a", "b"), shared_with(), unreachable=frozenset({"b"}))
    with pytest.raises(EnvironmentProblem, match=r"^node b is not reachable in memory$"):
        nodes.prepare(launch_over(transport, [HostEntry("a", 1), HostEntry("b", 1)]), PYTHON, tmp_path)
    assert [call for call in transport.calls if call[0] != "sees"] == []


def test_finish_stops_the_run_everywhere_and_brings_back_the_copied_nodes_rank_files(tmp_path: Path) -> None:
    on_b = tmp_path / "on-b"
    on_b.mkdir()
    (on_b / "rank1.jsonl").write_text('{"event": "hello"}\n')
    (on_b / "unrelated.txt").write_text("x")
    results = tmp_path / "launch" / "results"
    results.mkdir(parents=True)
    transport = MemoryNodes(("a", "b", "gone"), shared_with("a"), node_files={"b": on_b},
                            unreachable=frozenset({"gone"}))
    ready = [nodes.Node("a", (0,), True, "pdsh"), nodes.Node("b", (1,), False, "pdsh"),
             nodes.Node("gone", (2,), False, "pdsh")]
    nodes.finish(transport, ready, "run-7", results.parent, results)  # "gone" costs nothing but its files
    assert transport.calls[0] == ("stop", "run-7")
    assert sorted(p.name for p in results.iterdir()) == ["rank1.jsonl"]
    assert ("b", "copy_from", protocol.RESULTS_GLOB) in transport.calls
    assert ("b", "rm", "-rf", "--", str(results.parent)) in transport.calls
    assert not any(call[0] == "a" for call in transport.calls)


def test_a_launch_over_nodes_reads_every_ranks_records_the_shared_and_the_copied(tmp_path: Path) -> None:
    """launch_workers over a NodeLaunch: prepared, launched by the RankStart, finished, read; rank 1's file
    exists only on node b until `finish` brings it back."""
    node_b = tmp_path / "node-b"
    transport = MemoryNodes(("a", "b"), shared_with("a"), node_files={"b": node_b})
    over = launch_over(transport, [HostEntry("a", 1), HostEntry("b", 1)], LocalStart(node_b))
    shared, copied = nodes.Node("a", (0,), True, "local"), nodes.Node("b", (1,), False, "local")
    assert not progress_visible(over, [shared, copied]) and progress_visible(None, [])
    assert progress_visible(over, [shared])  # every node shares the launch directory: the stall rule can watch
    launched = launch_workers(PYTHON, lambda dirs: [str(dirs.results), str(node_b)], world_size=2, over=over,
                              patience=Patience(120, 60))
    assert launched.outcome.returncode == 0, launched.outcome.log_tail
    assert {rank: [r["event"] for r in records] for rank, records in launched.records.ranks.items()} == {
        0: ["hello"], 1: ["hello"]}
    assert [n.to_json()["files"] for n in launched.nodes] == ["shared", "copied"]
    assert launched.watched is False  # node b's files come back only at the end: the ceiling bounded it
    stops = [call for call in transport.calls if call[0] == "stop"]
    assert len(stops) == 1 and stops[0][1].startswith("mlstack-verify-")


def test_a_failed_launch_names_the_nodes_that_no_longer_answer() -> None:
    """A node lost mid-launch sends nothing; the others wait until the stall rule stops them. The outcome then
    names the lost node, asked once after the failure; a launch that passed asks nothing."""
    transport = MemoryNodes(("a", "b"), shared_with("a"), unreachable=frozenset({"b"}))
    stalled = launcher.LaunchOutcome(None, 150.0, True, "", stalled=True)
    named = nodes.name_lost_nodes(transport, stalled)
    assert named.ended_by == "node b is not reachable in memory (lost during the launch)"
    passed = launcher.LaunchOutcome(0, 10.0, False, "")
    assert nodes.name_lost_nodes(transport, passed) is passed
    assert transport.calls == [("lost",)]


def test_a_launcher_that_stops_its_ranks_is_not_stopped_twice(tmp_path: Path) -> None:
    """srun's run cancels its step until Slurm lists it no more; a second stop after it would wait out a lost
    node's cancel again (the Slurm lost-node test: 370 s where 250 s were enough)."""
    node_b = tmp_path / "node-b"
    transport = MemoryNodes(("a", "b"), shared_with("a"), node_files={"b": node_b})
    over = launch_over(transport, [HostEntry("a", 1), HostEntry("b", 1)],
                       LocalStart(node_b, stops_its_ranks=True))
    launched = launch_workers(PYTHON, lambda dirs: [str(dirs.results), str(node_b)], world_size=2, over=over,
                              patience=Patience(120, 60))
    assert launched.outcome.returncode == 0, launched.outcome.log_tail
    assert not [call for call in transport.calls if call[0] == "stop"]
    assert ("b", "copy_from", protocol.RESULTS_GLOB) in transport.calls  # the rest of finish still runs

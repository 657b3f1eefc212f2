"""A node transport (mlstack_ds/cluster/transport.py) whose nodes answer from the test: no ssh, no Slurm.

For the sequences written once against the seam (install over nodes, a launch's preparation and clean-up):
what they ask of the nodes and what they make of the answers, checked without reaching a node. The real
transports (SshNodes, SrunNodes) are tests/multinode's, and tests/unit/test_srun_nodes.py's stand-in srun."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlstack_ds.cluster.tool import ToolRun
from mlstack_ds.cluster.transport import ScriptAnswer
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.runner import RunResult


def answered_ok(_host: str, _args: Sequence[str]) -> ToolRun:
    return ToolRun(0, {}, "")


@dataclass
class MemoryNodes:
    """Nodes whose answers the test gives: which of this host's paths each sees (`seen`), what the tool says
    there (`tool`, `facts` for every node at once), the exit code of a plain command by its name
    (`exit_codes`), the files a node hands back (`node_files`: a directory per host), the unreachable ones.
    Every request is recorded in `calls`."""

    hosts: tuple[str, ...]
    seen: Callable[[str, Path], bool]
    tool: Callable[[str, Sequence[str]], ToolRun] = answered_ok
    facts: Mapping[str, Any] = field(default_factory=dict)
    exit_codes: Mapping[str, int] = field(default_factory=dict)
    node_files: Mapping[str, Path] = field(default_factory=dict)
    unreachable: frozenset[str] = frozenset()
    copies_files: bool = True
    option: str = "--hostfile"
    reached_by: str = "memory"
    no_answer: str = "not reachable in memory"
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def _reach(self, host: str) -> None:
        if host in self.unreachable:
            raise EnvironmentProblem(f"node {host} is {self.no_answer}", hint="bring it back")

    def check_ready(self, python: Path) -> None:
        self.calls.append(("check_ready", str(python)))

    def run_tool(self, host: str, args: Sequence[str | Path], *, patience: Patience,
                 run_id: str | None = None) -> ToolRun:
        self.calls.append((host, *map(str, args)))
        self._reach(host)
        return self.tool(host, [str(a) for a in args])

    def run_tool_on_each(self, args: Sequence[str | Path], *, patience: Patience,
                         done: Callable[[str, ToolRun], None] | None = None) -> list[ToolRun]:
        runs = [ToolRun(0, dict(self.facts), "") for _host in self.hosts]
        for host, run in zip(self.hosts, runs, strict=True):
            if done is not None:
                done(host, run)
        return runs

    def script_on_each(self, script: str, *, patience: Patience,
                       done: Callable[[ScriptAnswer], None] | None = None) -> list[ScriptAnswer]:
        raise AssertionError("no script is sent to these nodes")

    def run(self, host: str, argv: Sequence[str | Path], *, patience: Patience = WAITS["ssh command"]) -> RunResult:
        self.calls.append((host, *map(str, argv)))
        self._reach(host)
        return RunResult(tuple(map(str, argv)), self.exit_codes.get(str(argv[0]), 0), "", "", 0.0)

    def sees(self, paths: Sequence[Path]) -> Mapping[str, frozenset[str]]:
        self.calls.append(("sees", *map(str, paths)))
        for host in self.hosts:
            self._reach(host)
        return {host: frozenset(str(p) for p in paths if self.seen(host, p)) for host in self.hosts}

    def copy_to(self, host: str, local: Path, remote_parent: Path) -> None:
        self.calls.append((host, "copy", local.name))
        self._reach(host)

    def copy_from(self, host: str, remote_paths: Sequence[Path], local_dir: Path) -> None:
        self.calls.append((host, "copy_from", *(p.name for p in remote_paths)))
        self._reach(host)
        kept = self.node_files.get(host)
        for pattern in remote_paths:
            for found in sorted(kept.glob(pattern.name)) if kept is not None else ():
                shutil.copy2(found, local_dir / found.name)

    def lost(self) -> Mapping[str, str]:
        self.calls.append(("lost",))
        return {host: f"is {self.no_answer}" for host in self.hosts if host in self.unreachable}

    def stop(self, run_id: str) -> None:
        self.calls.append(("stop", run_id))

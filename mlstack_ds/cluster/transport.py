"""The one seam for reaching nodes: what install, doctor, verify and bench need of a multi-node run,
whichever way the nodes are reached.

Why a seam: `--hostfile` (ssh, cluster/ssh_nodes.py) and `--slurm` (srun, cluster/srun_nodes.py) grew as two
copies of every multi-node command, alike in outline and messages and different only in how a node is
reached. The commands are written once against `NodeTransport`; an implementation says only how to run
something on a node, on every node, how a file gets there and how to stop what a run started. A third way
in (Kubernetes' `kubectl exec`, an MPI launcher) is one more implementation (docs/architecture.md says what
it needs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mlstack_ds.cluster.tool import ToolRun
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.runner import RunResult


@dataclass(frozen=True)
class ScriptAnswer:
    """What one node printed for a script sent to every node (`NodeTransport.script_on_each`).

    `unreachable`: why the node ran nothing (its stdout is then empty); `interrupted`: why the script did not
    finish (a time-out, `timed_out`, or a failed exit), with whatever it printed before kept in `stdout`."""

    host: str
    stdout: str
    unreachable: str | None = None
    interrupted: str | None = None
    timed_out: bool = False


class NodeTransport(Protocol):
    """The nodes of one multi-node run, and how this host reaches them. Every method asks the nodes in
    `hosts` order and answers in that order; a node that cannot be reached is an EnvironmentProblem naming
    it, except in `script_on_each`, where it is an answer (doctor reports it as a finding)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """The nodes, in the user's order (a hostfile's lines, Slurm's node list)."""
        ...

    @property
    def option(self) -> str:
        """How the user named the nodes, as messages quote it: `--hostfile` or `--slurm`."""
        ...

    @property
    def reached_by(self) -> str:
        """What reaches a node, for messages about one that did not answer: `ssh`, `srun`."""
        ...

    @property
    def no_answer(self) -> str:
        """A status line's words for a node that ran nothing: `not reachable over ssh`, `no answer from srun`."""
        ...

    @property
    def copies_files(self) -> bool:
        """Whether `copy_to` can put a file on a node that does not see this host's (srun cannot)."""
        ...

    def check_ready(self, python: Path) -> None:
        """Before anything is asked of the nodes: each is reachable, with `python` and this tool at this host's
        paths, where the transport can tell before running the tool (one that cannot lets `run_tool_on_each`
        show it); EnvironmentProblem naming the first node that cannot take part."""
        ...

    def run_tool(self, host: str, args: Sequence[str | Path], *, patience: Patience,
                 run_id: str | None = None) -> ToolRun:
        """`mlstack-ds ARGS --json` on one node; with `run_id`, `stop(run_id)` stops it there."""
        ...

    def run_tool_on_each(self, args: Sequence[str | Path], *, patience: Patience,
                         done: Callable[[str, ToolRun], None] | None = None) -> list[ToolRun]:
        """`mlstack-ds ARGS --json` on every node; `done(host, run)` as each answers, in host order (the
        streamed status lines)."""
        ...

    def script_on_each(self, script: str, *, patience: Patience,
                       done: Callable[[ScriptAnswer], None] | None = None) -> list[ScriptAnswer]:
        """`sh -s` with `script` on stdin on every node; a node that ran nothing is an answer too. With a stall
        time in `patience`, what the script writes to stderr is its progress (nothing of this host's shows
        how the node fares): a script that works longer than that writes a line there while it works, the
        heartbeat's (cluster/heartbeat.py BEAT), which is not taken for the node's words."""
        ...

    def run(self, host: str, argv: Sequence[str | Path], *, patience: Patience = WAITS["ssh command"]) -> RunResult:
        """A plain command on one node (exit code and output of the command there)."""
        ...

    def sees(self, paths: Sequence[Path]) -> Mapping[str, frozenset[str]]:
        """Which of `paths` (files this host just wrote, or an interpreter) each node sees: a file system it
        shares with this host. One round trip; a node that cannot be reached is an EnvironmentProblem."""
        ...

    def copy_to(self, host: str, local: Path, remote_parent: Path) -> None:
        """Copy the file or directory `local` into `remote_parent` on `host` (only where `copies_files`)."""
        ...

    def copy_from(self, host: str, remote_paths: Sequence[Path], local_dir: Path) -> None:
        """Copy `remote_paths` (globs allowed) from `host` into `local_dir` (only where `copies_files`): a
        launch's rank files from a node that had a copy of its directory. A node that has none of them is not
        an error (a rank that never started wrote nothing); one that cannot be reached is."""
        ...

    def lost(self) -> Mapping[str, str]:
        """The nodes that no longer answer, and why (`not reachable over ssh: ...`), asked after a launch failed:
        a node lost mid-run (its link or power gone) sends nothing, not even a reset, so the other ranks wait
        for it until the stall rule stops them, and "timed out" alone would not say which node to look at."""
        ...

    def stop(self, run_id: str) -> None:
        """Stop whatever of run `run_id` still runs on any node (best effort: a node that went away keeps
        what it has), and return once it has ended. The tool there is asked to stop first (SIGTERM: it
        finishes a package swap it is in), killed only when it does not."""
        ...

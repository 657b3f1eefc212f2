"""Get every node ready for one launch of the worker, and clean up after it, whichever way the nodes are
reached: written once against the node seam (cluster/transport.py).

Every launcher over several nodes runs, on each node, the head's interpreter on the staged worker with
`--out <dir>`: the same paths everywhere. So before the launch, one round trip (`NodeTransport.sees`)
tells for every node with ranks whether it has the target interpreter and whether it sees this host's
launch directory (the staged worker, an empty results directory): nothing to do on a file system it shares
with this host, a copy (`copy_to`) otherwise, or a refusal where the transport copies nothing. After the
launch, whatever still runs of it is stopped on every node (`stop(run_id)`: a rank on another node is not
this host's child, and outlives its launcher), the copied nodes' rank files come back (`copy_from`) and
their copies are removed. How the ranks start (DeepSpeed's pdsh launcher, srun tasks) is a `RankStart`'s
(launch/pdsh.py, launch/srun.py): its argv, and how it reads the ranks' exit codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from mlstack_ds.cluster import remote
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.hostfile import HostEntry, rank_layout
from mlstack_ds.cluster.transport import NodeTransport
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.launch.launcher import LaunchOutcome
from mlstack_ds.patience import Patience
from mlstack_ds.worker.protocol import RESULTS_GLOB

PROBE_PREFIX = "shared-file-system-probe-"
NO_INTERPRETER_HINT = ("every node starts the ranks with the same interpreter path: create the environment there "
                       "at that path (a shared file system does it once)")
NOT_SHARED_HINT = ("the launch files go under TMPDIR: point it at a directory every node sees (e.g. "
                   "`TMPDIR=$HOME/tmp`), and create --python's environment at the same path on every node "
                   "(a shared file system does both)")


class RankStart(Protocol):
    """How the ranks of one launch start on nodes a transport made ready: what differs between DeepSpeed's
    pdsh launcher (`--hostfile`) and srun tasks (`--slurm`), and nothing else."""

    @property
    def name(self) -> str:
        """The launcher, as the report names it: `pdsh`, `srun`."""
        ...

    @property
    def progress_visible(self) -> bool:
        """Whether the ranks' result files grow here while they run (a launch directory every node shares),
        so that a stall can be told from progress; otherwise the files come back at the end."""
        ...

    @property
    def stops_its_ranks(self) -> bool:
        """Whether `run` leaves nothing of the launch on any node (srun: the step is the ranks, and it is
        cancelled until Slurm lists it no more), so that `finish` need not stop them again: for a lost node
        that second stop would wait out the step's cancel once more (120 s measured in the lost-node test)."""
        ...

    def argv(self, python: Path, args: Sequence[str], hosts: Sequence[HostEntry], *, launch_dir: Path,
             run_id: str, env: dict[str, str]) -> list[str]:
        """The launcher's argv for the worker (`args`) on `hosts`, once the launcher is known to be here; may
        add to `env` and write into `launch_dir` (before it reaches the nodes) what the ranks need."""
        ...

    def run(self, argv: Sequence[str], *, patience: Patience, run_id: str, env: Mapping[str, str], cwd: Path,
            progress: Callable[[], object] | None) -> LaunchOutcome:
        """One launch to its end or time-out, the ranks' exit codes read the launcher's way; nothing of it is
        left running here afterwards."""
        ...


@dataclass(frozen=True)
class NodeLaunch:
    """A launch over several nodes: how they are reached, how ranks start there, and the nodes with their
    slots (a hostfile's lines, or the allocation's first nodes)."""

    transport: NodeTransport
    start: RankStart
    hosts: tuple[HostEntry, ...]


@dataclass(frozen=True)
class Node:
    """One node of a launch, as the report shows it."""

    host: str
    ranks: tuple[int, ...]
    shared: bool  # sees this host's launch directory (shared file system) rather than a copy
    launcher: str  # the RankStart's name: pdsh, srun

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "ranks": list(self.ranks), "files": "shared" if self.shared else "copied",
                "launcher": self.launcher}


def prepare(launch: NodeLaunch, python: Path, launch_dir: Path, *,
            status: Callable[[str], None] = lambda _m: None) -> list[Node]:
    """Check every node with ranks and make `launch_dir` exist on it; one status line per node.

    One round trip for the checks (`sees`), then the copies where needed, all nodes at once. Raises
    EnvironmentProblem naming every node that cannot take part (an unreachable one: the transport's error);
    nothing has run anywhere then, and no copy is left."""
    transport = launch.transport
    layout = rank_layout(launch.hosts)
    probe = remote.SharedFileProbe.here(launch_dir, PROBE_PREFIX)
    try:
        seen = transport.sees([python, probe.path])
    finally:
        probe.remove()
    problems: dict[str, EnvironmentProblem] = {}
    to_copy: list[str] = []
    for host in layout:
        if str(python) not in seen.get(host, frozenset()):
            problems[host] = EnvironmentProblem(f"node {host} has no interpreter at {python}", hint=NO_INTERPRETER_HINT)
        elif str(probe.path) not in seen[host]:
            to_copy.append(host)

    def copy(host: str) -> None:
        if not transport.copies_files:
            raise EnvironmentProblem(f"node {host} does not see {launch_dir} (not a shared file system)",
                                     hint=NOT_SHARED_HINT)
        transport.copy_to(host, launch_dir, launch_dir.parent)

    copied = dict(zip(to_copy, on_each(to_copy, copy, catch=EnvironmentProblem), strict=True))
    problems |= {host: answer for host, answer in copied.items() if isinstance(answer, EnvironmentProblem)}
    nodes = [Node(host, tuple(ranks), host not in copied, launch.start.name)
             for host, ranks in layout.items() if host not in problems]
    ready = {node.host: node for node in nodes}
    for host in layout:  # one line per node, in the user's order
        node = ready.get(host)
        if node is None:
            status(f"{host}: {problems[host].message}")
            continue
        files = "shared file system" if node.shared else f"launch files copied over {transport.reached_by}"
        status(f"{host}: reachable, ranks {_ranks_text(node.ranks)}, {files}")
    if problems:
        remove_copies(transport, nodes, launch_dir)
        first = next(problems[h] for h in layout if h in problems)
        if len(problems) == 1:
            raise first
        others = "; ".join(problems[h].message for h in layout if h in problems)
        raise EnvironmentProblem(f"{len(problems)} nodes cannot take part: {others}", hint=first.hint)
    return nodes


def all_shared(nodes: Sequence[Node]) -> bool:
    """Whether every node sees this host's launch directory, so that the ranks' result files grow here while
    they run (none copied, whose files come back only at the end)."""
    return all(node.shared for node in nodes)


def name_lost_nodes(transport: NodeTransport, outcome: LaunchOutcome) -> LaunchOutcome:
    """`outcome` of a launch that failed, with the nodes that no longer answer (`NodeTransport.lost`) named
    as what ended it (`ended_by`); asked only on failure, and only when nothing else is named already."""
    if outcome.returncode == 0 or outcome.ended_by:
        return outcome
    with contextlib.suppress(EnvironmentProblem):
        lost = transport.lost()
        if lost:
            named = "; ".join(f"node {host} {why}" for host, why in lost.items())
            return replace(outcome, ended_by=f"{named} (lost during the launch)")
    return outcome


def finish(transport: NodeTransport, nodes: Sequence[Node], run_id: str, launch_dir: Path, results_dir: Path,
           *, stop: bool = True) -> None:
    """After the launch: stop what still runs of it on every node (unless the launcher did: `stop`), then
    fetch the copied nodes' rank files (final, since their writers are gone) and remove their copies. Best
    effort: a node that went away keeps what it has."""
    if stop:
        with contextlib.suppress(EnvironmentProblem):
            transport.stop(run_id)

    def fetch_and_remove(node: Node) -> None:
        with contextlib.suppress(EnvironmentProblem):
            transport.copy_from(node.host, [results_dir / RESULTS_GLOB], results_dir)
            transport.run(node.host, ["rm", "-rf", "--", launch_dir])

    on_each([n for n in nodes if not n.shared], fetch_and_remove)


def remove_copies(transport: NodeTransport, nodes: Sequence[Node], launch_dir: Path) -> None:
    """Remove the copies of the launch directory, on every copied node at once (best effort)."""
    def remove(node: Node) -> None:
        with contextlib.suppress(EnvironmentProblem):
            transport.run(node.host, ["rm", "-rf", "--", launch_dir])

    on_each([n for n in nodes if not n.shared], remove)


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}" if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"

"""The one launch sequence of the worker package, for verify's checks and bench's stages alike.

In order: a private launch directory (the staged worker, an empty results directory); the launcher's
argv (torchrun here, or the `RankStart` of a launch over nodes: DeepSpeed's pdsh launcher, srun tasks) and
the nodes made ready (`nodes.prepare`, over the node seam); the launch, bounded by the time-out, swept
afterwards; every node's processes of it stopped and the copied nodes' result files fetched back
(`nodes.finish`); then every rank's records read through the worker's own protocol module, before the
directory goes away. One sequence whichever way the nodes are reached: only the `NodeLaunch` differs.

Why one: the guarantees (nothing left running on any node, results read even from a rank that died or
a launch that was interrupted) hold for every caller only if there is one sequence that gives them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlstack_ds.launch import launcher, nodes
from mlstack_ds.launch.nodes import NodeLaunch
from mlstack_ds.patience import Patience
from mlstack_ds.worker import protocol

Record = Mapping[str, Any]


@dataclass(frozen=True)
class LaunchDirs:
    """Where one launch lives: `root` (the same path on every node), `results` (the ranks' `--out`)."""

    root: Path
    results: Path
    run_id: str


@dataclass(frozen=True)
class RankRecords:
    """What the ranks of one launch wrote (the worker's result protocol), read before its directory goes."""

    ranks: Mapping[int, Sequence[Record]]  # every rank of the world, [] for one that wrote nothing
    summary: Record | None = None  # rank 0's gathered results, when it wrote them


@dataclass(frozen=True)
class Launched:
    argv: tuple[str, ...]
    outcome: launcher.LaunchOutcome
    records: RankRecords
    nodes: tuple[nodes.Node, ...] = field(default_factory=tuple)
    watched: bool = True  # the stall rule applied (`progress_visible`); else a fixed bound did


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a launch: every process of it is already killed, on every node; carries what
    the ranks had written by then. A KeyboardInterrupt, so a caller that keeps nothing need not know it."""

    def __init__(self, records: RankRecords) -> None:
        super().__init__("interrupted")
        self.records = records


def progress_visible(over: NodeLaunch | None, node_list: Sequence[nodes.Node]) -> bool:
    """Whether the ranks' result files grow here while they run: on one node, where the launcher shares the
    launch directory with every node (srun), or where every node of a hostfile shares it; not when a node
    has a copy, whose files are fetched at the end."""
    return over is None or over.start.progress_visible or nodes.all_shared(node_list)


def results_progress(results: Path) -> tuple[tuple[str, int], ...]:
    """The ranks' result files and their sizes: every event a rank writes (hello, a check begun, a check
    finished, the summary) changes it, so an unchanged value means no rank got anywhere."""
    try:
        entries = sorted(results.iterdir())
    except OSError:
        return ()
    sizes = []
    for entry in entries:
        try:
            sizes.append((entry.name, entry.stat().st_size))
        except OSError:  # removed between listing and stat
            continue
    return tuple(sizes)


def read_records(results: Path, world_size: int) -> RankRecords:
    return RankRecords({rank: protocol.read_rank_file(results, rank) for rank in range(world_size)},
                       protocol.read_summary(results))


def launch_workers(python: Path, worker_args: Callable[[LaunchDirs], list[str]], *, world_size: int,
                   over: NodeLaunch | None, patience: Patience, extra_env: Mapping[str, str] | None = None,
                   status: Callable[[str], None] = lambda _m: None, prefix: str = "mlstack-launch-",
                   watch: Callable[[Path], AbstractContextManager[object]] | None = None,
                   unwatched: Patience | None = None) -> Launched:
    """Run the worker (`worker_args(dirs)`: its module and arguments; files it needs go under `dirs.root`,
    which reaches every node) on `world_size` ranks here, or `over` several nodes (launch/nodes.py), for at
    most `patience.ceiling_s`; `watch(results)` runs around the launch itself (bench's progress lines). With
    `patience.stall_s`, the launch is also stopped when no rank's result file changed for that long, where this
    process sees those files as they are written (`progress_visible`); elsewhere `unwatched` (a fixed bound;
    default `patience.ceiling_s`) alone bounds it. A failed launch names the nodes lost meanwhile (`name_lost_nodes`).

    Raises what the node preparation raises (nothing has run then), LaunchInterrupted on Ctrl-C."""
    run_id = launcher.new_run_id()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        dirs = LaunchDirs(Path(tmp), Path(tmp) / "results", run_id)
        dirs.results.mkdir()
        staged = launcher.stage_worker(dirs.root / "code")
        args = worker_args(dirs)
        env = launcher.worker_env({**os.environ, **(extra_env or {})}, staged)
        progress = (lambda: results_progress(dirs.results)) if patience.watched else None
        if over is None:
            argv = launcher.torchrun_argv(python, world_size, launcher.free_port(), args)
            node_list: list[nodes.Node] = []
        else:
            argv = over.start.argv(python, args, over.hosts, launch_dir=dirs.root, run_id=run_id, env=env)
            node_list = nodes.prepare(over, python, dirs.root, status=status)
        watched = progress_visible(over, node_list)
        if not watched:
            progress = None
            patience = unwatched if unwatched is not None else Patience(ceiling_s=patience.ceiling_s)
        try:
            with watch(dirs.results) if watch is not None else nullcontext():
                # the working directory exists on every node: DeepSpeed's launcher `cd`s to it there
                outcome = _run(over, argv, patience=patience, run_id=run_id, env=env, cwd=staged, progress=progress)
            if over is not None:
                outcome = nodes.name_lost_nodes(over.transport, outcome)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the launch is already killed; keep what finished
            _finish(over, node_list, dirs)
            raise LaunchInterrupted(read_records(dirs.results, world_size)) from None
        except BaseException:
            _finish(over, node_list, dirs)
            raise
        _finish(over, node_list, dirs)
        records = read_records(dirs.results, world_size)
    return Launched(tuple(argv), outcome, records, tuple(node_list), watched and patience.watched)


def _run(over: NodeLaunch | None, argv: Sequence[str], *, patience: Patience, run_id: str, env: Mapping[str, str],
         cwd: Path, progress: Callable[[], object] | None) -> launcher.LaunchOutcome:
    if over is None:
        return launcher.run_launch(argv, patience=patience, run_id=run_id, env=env, cwd=cwd, progress=progress)
    return over.start.run(argv, patience=patience, run_id=run_id, env=env, cwd=cwd, progress=progress)


def _finish(over: NodeLaunch | None, node_list: Sequence[nodes.Node], dirs: LaunchDirs) -> None:
    if over is not None:
        nodes.finish(over.transport, node_list, dirs.run_id, dirs.root, dirs.results,
                     stop=not over.start.stops_its_ranks)

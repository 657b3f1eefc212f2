"""The one launch sequence of the worker package, for verify's checks and bench's stages alike.

In order: a private launch directory (the staged worker, an empty results directory); the launcher's
argv and the nodes made ready (`nodes.launch_command`: torchrun here, or DeepSpeed's launcher over a
hostfile's nodes); the launch, bounded by the time-out, swept afterwards (`launcher.run_launch`); every
node's processes of it killed and the copied nodes' result files fetched back (`nodes.finish`); then every
rank's records read through the worker's own protocol module, before the directory goes away.

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

from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_steps import find_srun
from mlstack_ds.launch import launcher, nodes, srun
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
    nodes: tuple[nodes.Node | srun.SlurmNode, ...] = field(default_factory=tuple)


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a launch: every process of it is already killed, on every node; carries what
    the ranks had written by then. A KeyboardInterrupt, so a caller that keeps nothing need not know it."""

    def __init__(self, records: RankRecords) -> None:
        super().__init__("interrupted")
        self.records = records


def progress_visible(hosts: Sequence[HostEntry] | None, allocation: Allocation | None) -> bool:
    """Whether the ranks' result files grow here while they run: on one node, or under Slurm (whose
    launch directory every node shares); not over a hostfile, whose nodes' files are fetched at the end."""
    return hosts is None or allocation is not None


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
                   hosts: Sequence[HostEntry] | None, hostfile: Path | None, timeout_s: float,
                   extra_env: Mapping[str, str] | None = None, status: Callable[[str], None] = lambda _m: None,
                   prefix: str = "mlstack-launch-",
                   watch: Callable[[Path], AbstractContextManager[object]] | None = None,
                   allocation: Allocation | None = None, stall_s: float | None = None) -> Launched:
    """Run the worker (`worker_args(dirs)`: its module and arguments; files it needs go under `dirs.root`,
    which reaches every node) on `world_size` ranks, or on `hosts` with a hostfile, or on `hosts` of a
    Slurm `allocation` with srun (launch/srun.py), for at most `timeout_s`; `watch(results)` runs around the
    launch itself (bench's progress lines). With `stall_s`, the launch is also stopped when no rank's result
    file changed for that long, where this process sees those files as they are written (one node, or
    Slurm's shared launch directory); a hostfile's nodes send theirs only at the end, so there `timeout_s`
    alone bounds it (`progress_visible`).

    Raises what the node preparation raises (nothing has run then), LaunchInterrupted on Ctrl-C."""
    run_id = launcher.new_run_id()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        dirs = LaunchDirs(Path(tmp), Path(tmp) / "results", run_id)
        dirs.results.mkdir()
        staged = launcher.stage_worker(dirs.root / "code")
        args = worker_args(dirs)
        env = launcher.worker_env({**os.environ, **(extra_env or {})}, staged)
        progress = (lambda: results_progress(dirs.results)) if stall_s is not None else None
        if allocation is not None and hosts is not None:
            return _launch_srun(python, args, env, allocation=allocation, hosts=hosts, dirs=dirs, staged=staged,
                                world_size=world_size, timeout_s=timeout_s, status=status, watch=watch,
                                stall_s=stall_s, progress=progress)
        if not progress_visible(hosts, allocation):
            stall_s = progress = None
        argv, node_list = nodes.launch_command(python, args, env, launch_dir=dirs.root, run_id=run_id,
                                               world_size=world_size, hosts=hosts, hostfile=hostfile, status=status)
        try:
            with watch(dirs.results) if watch is not None else nullcontext():
                # the working directory exists on every node: DeepSpeed's launcher `cd`s to it there
                outcome = launcher.run_launch(argv, timeout_s=timeout_s, run_id=run_id, env=env, cwd=staged,
                                              stall_s=stall_s, progress=progress)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the launch is already killed; keep what finished
            nodes.finish(node_list, run_id, dirs.root, dirs.results, env=env)
            raise LaunchInterrupted(read_records(dirs.results, world_size)) from None
        except BaseException:
            nodes.finish(node_list, run_id, dirs.root, dirs.results, env=env)
            raise
        nodes.finish(node_list, run_id, dirs.root, dirs.results, env=env)
        records = read_records(dirs.results, world_size)
    return Launched(tuple(argv), outcome, records, tuple(node_list))


def _launch_srun(python: Path, args: Sequence[str], env: dict[str, str], *, allocation: Allocation,
                 hosts: Sequence[HostEntry], dirs: LaunchDirs, staged: Path, world_size: int, timeout_s: float,
                 status: Callable[[str], None],
                 watch: Callable[[Path], AbstractContextManager[object]] | None,
                 stall_s: float | None, progress: Callable[[], object] | None) -> Launched:
    """The Slurm branch: every node checked by one srun step, then one task per rank; srun.run_launch
    returns only when no task of either step is left on any node (the launch directory is shared)."""
    srun_path = find_srun(env)
    env.update(srun.rendezvous_env(hosts))
    node_list = srun.check_nodes(python, dirs.root, allocation=allocation, hosts=hosts,
                                 run_id=dirs.run_id, env=env, status=status)
    argv = srun.srun_argv(srun_path, python, args, allocation=allocation, hosts=hosts, run_id=dirs.run_id)
    try:
        with watch(dirs.results) if watch is not None else nullcontext():
            outcome = srun.run_launch(argv, timeout_s=timeout_s, job_id=allocation.job_id, run_id=dirs.run_id,
                                      env=env, cwd=staged, stall_s=stall_s, progress=progress)
    except KeyboardInterrupt:
        raise LaunchInterrupted(read_records(dirs.results, world_size)) from None
    return Launched(tuple(argv), outcome, read_records(dirs.results, world_size), tuple(node_list))

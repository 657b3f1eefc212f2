"""The checks before any launch of the worker, shared by verify and bench: the target interpreter has torch,
and how many ranks run (the hostfile's slots, else what was asked, else one per GPU, else 2).

Why here and not in verify: bench launches the same worker the same way, and must refuse the same
targets with the same words; it must not depend on verify's suite to do so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.cluster import hostfile
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.detect import target_probe
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.errors import EnvironmentProblem, UsageError

CPU_WORLD_SIZE = 2  # ranks on a machine without GPUs: the fewest that exercise the collectives


@dataclass(frozen=True)
class TargetProbe:
    torch_version: str | None
    gpus: int
    error: str
    deepspeed_version: str | None = None
    clients: tuple[tuple[str, str], ...] = ()  # transformers, accelerate, ...: what the checks ran with


def probe_target(python: Path, known: TargetFacts | None = None) -> TargetProbe:
    """Is torch importable in `python`, and how many GPUs does it see? From `known` when the caller
    already asked this interpreter with torch's part (install: detect's probe), else from a new probe."""
    facts = known if known is not None and known.torch_probed else target_probe.probe_target(python)
    if facts.torch is None:
        return TargetProbe(None, 0, facts.torch_error or facts.problem or "")
    return TargetProbe(facts.torch.version, facts.torch.device_count, "",
                       facts.deepspeed.version if facts.deepspeed else None, facts.clients)


def require_torch(python: Path, known: TargetFacts | None = None) -> TargetProbe:
    """The probe of `python`; EnvironmentProblem when torch is not importable there (nothing can run: the
    environment is the problem, not a check or a stage)."""
    probe = probe_target(python, known)
    if probe.torch_version is None:
        raise EnvironmentProblem(f"torch is not importable in {python}: {probe.error or 'not installed'}",
                                 hint="install PyTorch there (and DeepSpeed with `mlstack-ds install`), "
                                 "or point --python at the environment that has them")
    return probe


def refuse_world_size_with_hostfile(world_size: object | None, hostfile_path: Path | None) -> None:
    """`--world-size` and `--hostfile` together are a usage error: the hostfile's slots decide."""
    if hostfile_path is not None and world_size is not None:
        raise UsageError("--world-size cannot be combined with --hostfile",
                         hint="the hostfile's slots=N entries decide how many ranks run on each node")


def world_sizes(probe: TargetProbe, requested: Sequence[int], hostfile_path: Path | None,
                hosts: Sequence[hostfile.HostEntry] | None) -> tuple[int, ...]:
    """The ranks of each launch: the hostfile's slots, else `requested`, else the GPUs, else 2."""
    if hosts is not None and hostfile_path is not None:
        return (hostfile.hostfile_world_size(hostfile_path, hosts),)
    return tuple(requested) or ((probe.gpus if probe.gpus > 0 else CPU_WORLD_SIZE),)


def refuse_world_size_with_slurm(world_size: object | None, slurm: bool) -> None:
    """`--world-size` and `--slurm` together are a usage error: the allocation decides."""
    if slurm and world_size is not None:
        raise UsageError("--world-size cannot be combined with --slurm",
                         hint="the allocation decides: `salloc -N2 --ntasks-per-node=N` (or --gpus-per-node) "
                         "runs N ranks on each node")


def slurm_ranks_per_node(probe: TargetProbe, allocation: Allocation) -> int:
    """The allocation's tasks (or GPUs) per node, else the GPUs this node's torch sees, else one."""
    return allocation.ranks_per_node or (probe.gpus if probe.gpus > 0 else 1)

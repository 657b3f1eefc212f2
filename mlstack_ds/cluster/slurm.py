"""The Slurm allocation the tool runs in (`--slurm`): its job id, its nodes, and the ranks each node gets.

Inside `salloc` or an `sbatch` script the allocation is the cluster: users write no hostfile. The nodes come
from `SLURM_JOB_NODELIST`, expanded by `scontrol show hostnames` (Slurm's own grammar: `gpu[01-04,07]`); the
ranks per node from `SLURM_NTASKS_PER_NODE` (what the user asked with `--ntasks-per-node`), else
`SLURM_GPUS_ON_NODE` (set inside a step with GPUs), else the caller's count of GPUs on this node, else one
(a CPU node: one rank per node is what exercises the inter-node path). Outside an allocation `--slurm` is a
usage error that names `salloc`/`sbatch`, before anything runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlstack_ds import runner
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.errors import EnvironmentProblem, ToolError, UsageError
from mlstack_ds.patience import WAITS

OUTSIDE_HINT = ("run it inside an allocation: `salloc -N2 mlstack-ds ...`, or in an `sbatch` script "
                "(`mlstack-ds verify --slurm --print-sbatch` prints one)")


@dataclass(frozen=True)
class Allocation:
    """One Slurm job's nodes, in Slurm's order (the first one serves the rendezvous)."""

    job_id: str
    nodes: tuple[str, ...]
    ranks_per_node: int | None  # from the allocation's environment; None: the caller decides (GPUs, else 1)

    def hosts(self, ranks_per_node: int, node_count: int | None = None) -> list[HostEntry]:
        """The first `node_count` nodes (default: all) with `ranks_per_node` ranks each, as hostfile entries."""
        return [HostEntry(node, ranks_per_node) for node in self.nodes[:node_count or len(self.nodes)]]

    def to_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "nodes": list(self.nodes), "ranks_per_node": self.ranks_per_node}


def refuse_with_hostfile(slurm: bool, hostfile: object | None) -> None:
    if slurm and hostfile is not None:
        raise UsageError("--slurm cannot be combined with --hostfile",
                         hint="inside an allocation the nodes come from Slurm; outside one, use --hostfile alone")


def current(env: Mapping[str, str], *, path: str | None = None) -> Allocation:
    """The allocation this process runs in; UsageError outside one, EnvironmentProblem without scontrol."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise UsageError("--slurm needs a Slurm allocation: SLURM_JOB_ID is not set here", hint=OUTSIDE_HINT)
    return Allocation(job_id, tuple(expand_nodelist(nodelist, env=env, path=path)), ranks_per_node(env))


def expand_nodelist(nodelist: str, *, env: Mapping[str, str], path: str | None = None) -> list[str]:
    """`scontrol show hostnames NODELIST`: Slurm's own expansion of `a[1-3],b`."""
    scontrol = runner.which("scontrol", path=path if path is not None else env.get("PATH"))
    if scontrol is None:
        raise EnvironmentProblem("scontrol is not on PATH: the allocation's node list cannot be expanded",
                                 hint="load the Slurm client (e.g. `module load slurm`) or put its bin on PATH")
    try:
        result = runner.run([scontrol, "show", "hostnames", nodelist], patience=WAITS["scontrol"], env=env)
    except ToolError as exc:
        raise EnvironmentProblem(f"scontrol show hostnames {nodelist}: {exc.message}",
                                 hint="is slurmctld reachable from here (`sinfo`)?") from exc
    names = result.stdout.split()
    if result.returncode != 0 or not names:
        raise EnvironmentProblem(f"scontrol show hostnames {nodelist} failed ({result.returncode}): "
                                 f"{result.stderr.strip() or 'no hosts'}", hint="is slurmctld reachable (`sinfo`)?")
    return names


def ranks_per_node(env: Mapping[str, str]) -> int | None:
    """`SLURM_NTASKS_PER_NODE`, else `SLURM_GPUS_ON_NODE` (a positive count), else None."""
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        match = re.fullmatch(r"\s*(\d+)\s*", env.get(name, ""))
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


def node_counts(requested: Sequence[int], allocation: Allocation) -> tuple[int, ...]:
    """`--nodes 1,2`: each count within the allocation (default: all its nodes); UsageError otherwise."""
    for count in requested:
        if count < 1 or count > len(allocation.nodes):
            raise UsageError(f"--nodes {count}: the allocation has {len(allocation.nodes)} node(s)",
                             hint=f"give counts from 1 to {len(allocation.nodes)}, or allocate more (`salloc -N`)")
    return tuple(requested) or (len(allocation.nodes),)


def sbatch_script(tool: Sequence[str], python: str, verify_args: Sequence[str], *, nodes: int = 2,
                  ranks_per_node: int | None = None) -> str:
    """`verify --slurm --print-sbatch`: a batch script that checks the allocation (doctor) and verifies
    DeepSpeed across it. `tool` is how this mlstack-ds was started (the same command runs in the job);
    `ranks_per_node` fills --ntasks-per-node (None: the GPU lines stay, to be set to the node's GPUs)."""
    mls = " ".join(shlex.quote(part) for part in tool)
    extra = "".join(f" {shlex.quote(arg)}" for arg in verify_args)
    per_node = (f"#SBATCH --ntasks-per-node={ranks_per_node}      # ranks per node\n" if ranks_per_node else
                "#SBATCH --ntasks-per-node=8       # ranks per node: one per GPU\n"
                "#SBATCH --gpus-per-node=8         # the node's GPUs (Slurm then sets ROCR_VISIBLE_DEVICES)\n")
    return (
        "#!/bin/bash\n"
        "# mlstack-ds: check the allocation's nodes, then verify DeepSpeed across them (docs/multinode.md).\n"
        "#SBATCH --job-name=mlstack-verify\n"
        f"#SBATCH --nodes={nodes}\n"
        f"{per_node}"
        "#SBATCH --cpus-per-task=4         # cores per rank: cpu_adam (ZeRO offload) and data loading\n"
        "#SBATCH --time=00:30:00\n"
        "#SBATCH --output=%x-%j.out\n"
        "set -euo pipefail\n"
        "export OMP_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"\n"
        "export SRUN_CPUS_PER_TASK=\"${SLURM_CPUS_PER_TASK:-1}\"  # srun does not inherit it (Slurm >= 22.05)\n"
        "unset HIP_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES    # Slurm's ROCR_VISIBLE_DEVICES selects the GPUs\n"
        "# export GLOO_SOCKET_IFNAME=<if> NCCL_SOCKET_IFNAME=<if>   # the interface the nodes share (doctor "
        "names it)\n"
        f"PYTHON={shlex.quote(python)}\n"
        f"{mls} doctor --slurm --python \"$PYTHON\"\n"
        f"{mls} verify --slurm --python \"$PYTHON\"{extra}\n"
    )

"""Inside a Slurm allocation (`doctor --slurm`): what Slurm itself sets up wrong for DeepSpeed on AMD GPUs,
seen from one srun task per node (gathered by doctor/cluster.py; each check a pure function of
`ClusterInput`). The per-node facts and differences are cluster_rules.py's, as with `--hostfile`."""

from __future__ import annotations

import ipaddress
import re

from mlstack_ds.doctor.cluster_input import ClusterInput, peer_interfaces
from mlstack_ds.doctor.model import Hit, Rule
from mlstack_ds.doctor.rules.cluster_rules import NAMED_NODES, _names

MASKS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _slurm(inp: ClusterInput) -> bool:
    return inp.launcher == "srun"


def double_masking(inp: ClusterInput) -> Hit | None:
    if not _slurm(inp):
        return None
    hits = []
    for node in inp.reachable:
        rocr = node.task_env.get("ROCR_VISIBLE_DEVICES")
        others = [f"{m}={node.task_env[m]}" for m in MASKS if node.task_env.get(m)]
        if rocr and others:
            hits.append(f"{node.host}: ROCR_VISIBLE_DEVICES={rocr} and {', '.join(others)}")
    if not hits:
        return None
    return Hit("; ".join(hits[:NAMED_NODES]) + (f"; and {len(hits) - NAMED_NODES} more" if len(hits) > NAMED_NODES
                                                 else ""))


def cpus_per_task(inp: ClusterInput) -> Hit | None:
    if not _slurm(inp):
        return None
    few = []
    for node in inp.reachable:
        if not node.task_env or node.task_env.get("OMP_NUM_THREADS", "1") not in ("", "1"):
            continue
        cpus = node.task_env.get("SLURM_CPUS_PER_TASK", "")
        if cpus in ("", "1"):
            few.append(node.host)
    if not few:
        return None
    return Hit(f"SLURM_CPUS_PER_TASK unset or 1 and OMP_NUM_THREADS unset or 1 on {_names(few)}: each rank's "
               "CPU work (cpu_adam of ZeRO offload, data loading) gets one core")


def _rendezvous_problem(inp: ClusterInput) -> list[str]:
    if inp.rendezvous is None or not inp.reachable:
        return []
    host = inp.rendezvous[0]
    first = next((n for n in inp.reachable if host in (n.host, n.hostname)), None)
    shared: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    if first is not None:
        others = tuple(o for o in inp.reachable if o is not first)
        names = set(peer_interfaces(first, others)) if others else {a.interface for a in first.addresses}
        shared = {a.ip for a in first.addresses if a.interface in names and not a.loopback and a.scope == "global"}
    problems = []
    for node in inp.reachable:
        if not node.task_env and not node.rendezvous_resolved:
            continue  # not asked (an older node script)
        if not node.rendezvous_resolved:
            problems.append(f"{node.host}: {host} resolves to no address")
            continue
        address = ipaddress.ip_address(node.rendezvous_resolved[0])
        if address.is_loopback:
            problems.append(f"{node.host}: {host} resolves first to loopback {address}")
        elif shared and address not in shared:
            problems.append(f"{node.host}: {host} resolves to {address}, not an address of {host} on the network "
                            f"the nodes share ({', '.join(sorted(map(str, shared)))})")
    return problems


def rendezvous_resolution(inp: ClusterInput) -> Hit | None:
    if not _slurm(inp):
        return None
    problems = _rendezvous_problem(inp)
    if not problems:
        return None
    return Hit("; ".join(problems[:NAMED_NODES]) + (f"; and {len(problems) - NAMED_NODES} more"
                                                    if len(problems) > NAMED_NODES else ""))


def port_unreachable(inp: ClusterInput) -> Hit | None:
    if not _slurm(inp) or inp.rendezvous is None:
        return None
    host, port = inp.rendezvous
    failed = [(n.host, n.port_check) for n in inp.reachable if n.port_check not in (None, "ok")]
    parts = [f"{node}: {why}" for node, why in failed[:NAMED_NODES]]
    if inp.port_problem:
        parts.insert(0, f"this host cannot listen on port {port}: {inp.port_problem}")
    if not failed and not inp.port_problem:
        return None
    return Hit(f"a job step cannot connect to {host}:{port}: " + "; ".join(parts)
               + (f"; and {len(failed) - NAMED_NODES} more nodes" if len(failed) > NAMED_NODES else ""))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-SLURM-001",
        severity="warning",
        title="ROCR_VISIBLE_DEVICES from Slurm together with HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES",
        symptom="Slurm's GPU binding (gres/gpu on AMD) sets ROCR_VISIBLE_DEVICES for each task; a script that also "
        "sets HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES masks a second time, on the indices left after the "
        "first mask: ranks see the wrong GPU, two ranks share one, or `hipErrorNoDevice` / `invalid device "
        "ordinal` at `set_device(LOCAL_RANK)`.",
        fix=("unset HIP_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES   # in the sbatch script: let Slurm's "
             "ROCR_VISIBLE_DEVICES alone select the GPUs",
             "or request no GPU binding from Slurm and set one mask yourself"),
        source="ROCm docs (GPU isolation: ROCR_VISIBLE_DEVICES is applied first, HIP_VISIBLE_DEVICES then indexes "
        "what is left); Slurm gres.conf on AMD sets ROCR_VISIBLE_DEVICES",
        cluster_check=double_masking,
    ),
    Rule(
        id="MLS-SLURM-002",
        severity="warning",
        title="One CPU per task: --cpus-per-task unset or 1 and OMP_NUM_THREADS unset",
        symptom="Slurm gives each task one CPU unless the job asks `--cpus-per-task`; a rank's CPU work then runs "
        "on one core: ZeRO-Offload's cpu_adam step (OpenMP) and the data loader become the bottleneck, "
        "steps take many times longer, and torch warns `OMP_NUM_THREADS` is 1.",
        fix=("#SBATCH --cpus-per-task=<cores per node / ranks per node>",
             "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK   # in the sbatch script, before the launch",
             "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK   # srun no longer inherits it from sbatch/salloc "
             "(Slurm >= 22.05)"),
        source="Slurm sbatch(1)/srun(1) --cpus-per-task; DeepSpeed cpu_adam (csrc/adam/cpu_adam_impl.cpp, OpenMP)",
        cluster_check=cpus_per_task,
    ),
    Rule(
        id="MLS-SLURM-003",
        severity="error",
        title="The rendezvous host resolves to loopback or to an address the nodes do not share",
        symptom="The ranks meet at the allocation's first node (MASTER_ADDR): a node on which that name resolves to "
        "127.0.x.x connects to itself, and one on which it resolves to an address on another network "
        "(a management Ethernet instead of the fabric) waits until `torch.distributed` times out "
        "(`DistNetworkError: ... connect() timed out`).",
        fix=("export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)-<fabric suffix>  "
             "# the name of the first node on the nodes' shared network",
             "or fix /etc/hosts on the nodes: the first node's name on its address on the shared network",
             "export GLOO_SOCKET_IFNAME=<interface> NCCL_SOCKET_IFNAME=<interface>"),
        source="measured on the two-node test cluster (a node name on 127.0.1.1 on one node); torch "
        "TCPStore/gloo rendezvous",
        cluster_check=rendezvous_resolution,
    ),
    Rule(
        id="MLS-SLURM-004",
        severity="error",
        title="A job step cannot reach the rendezvous port",
        symptom="Every rank connects to MASTER_ADDR:MASTER_PORT; a port a firewall blocks, that another process "
        "holds (only on loopback, or a previous job's rank 0 still running) or that is not reachable from "
        "the compute nodes ends the launch with `DistNetworkError: ... Connection refused` or a time-out.",
        fix=("export MASTER_PORT=<a free port the nodes may use>   # e.g. 29500 + SLURM_JOB_ID % 1000",
             "ask the admins which ports compute nodes may open between them",
             "kill what holds the port on the first node (`ss -ltnp 'sport = :<port>'`)"),
        source="doctor --slurm: a TCP connect from a task on every node to a port this host listens on",
        cluster_check=port_unreachable,
    ),
    Rule(
        id="MLS-SLURM-005",
        severity="error",
        title="DeepSpeed's `--launcher slurm` needs sinfo here and mpi4py with an MPI-aware srun on the nodes",
        symptom="`deepspeed --launcher slurm` fails with `RuntimeError: launcher 'slurm' not installed.` where "
        "`sinfo` is not on PATH (its only check); where it is, it runs `srun -n <slots> --export=ALL,... "
        "python -u script.py`, which sets no RANK/WORLD_SIZE/MASTER_ADDR: every rank's `init_distributed` "
        "falls back to mpi4py (`ModuleNotFoundError: No module named 'mpi4py'`, MLS-DS-007), and even with "
        "mpi4py the ranks see one world only when srun starts them through PMI (`--mpi=pmix`/`pmi2`). "
        "With `--include` it passes that flag to srun, which has none (srun's is `--nodelist`).",
        fix=("run it inside the allocation (salloc/sbatch) with the Slurm client on PATH (`module load slurm`; "
             "`which sinfo`)",
             "pip install mpi4py   # into the target environment, built against the cluster's MPI; and "
             "--launcher_args '--mpi=pmix' (srun --mpi=list shows what the cluster has)",
             "or no MPI at all: one srun task per rank with RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS "
             "LOCAL_RANK=$SLURM_LOCALID MASTER_ADDR=<first node> MASTER_PORT=<port> (what `mlstack-ds verify "
             "--slurm` runs; docs/multinode.md), or one `torchrun --nnodes $SLURM_NNODES ...` per node"),
        source="DeepSpeed 0.19.5 deepspeed/launcher/multinode_runner.py (SlurmRunner.backend_exists: sinfo; "
        "get_cmd) and launcher/runner.py (`launcher ... not installed`); captured on the two-node test cluster "
        "(tests/fixtures/doctor-logs/SOURCES.md)",
        log_patterns=(re.compile(r"launcher 'slurm' not installed"),),
    ),
)

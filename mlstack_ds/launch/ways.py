"""The ways a launch reaches several nodes, each a transport (cluster/transport.py) with the launcher that
starts ranks over it: `--hostfile` is ssh with DeepSpeed's pdsh launcher, `--slurm` srun steps with one srun
task per rank. verify and bench choose here, in one place (`over_nodes`); the launch itself
(launch/session.py, launch/nodes.py) is one sequence for every way in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_nodes import SrunNodes
from mlstack_ds.cluster.ssh_nodes import SshNodes
from mlstack_ds.launch.nodes import NodeLaunch
from mlstack_ds.launch.pdsh import PdshStart
from mlstack_ds.launch.srun import SrunStart


def over_nodes(hostfile: Path | None, hosts: Sequence[HostEntry] | None, allocation: Allocation | None,
               env: Mapping[str, str]) -> NodeLaunch | None:
    """The way in for a launch on `hosts`: the allocation's nodes through srun, the hostfile's over ssh, or
    None (this machine, torchrun)."""
    if hosts is None:
        return None
    if allocation is not None:
        return over_slurm(allocation, hosts, env)
    return over_hostfile(hostfile, hosts) if hostfile is not None else None


def over_hostfile(hostfile: Path, hosts: Sequence[HostEntry]) -> NodeLaunch:
    """The hostfile's nodes over ssh (those with slots: a `slots=0` host runs nothing), ranks by pdsh."""
    return NodeLaunch(SshNodes(tuple(h for h in hosts if h.slots)), PdshStart(hostfile), tuple(hosts))


def over_slurm(allocation: Allocation, hosts: Sequence[HostEntry], env: Mapping[str, str]) -> NodeLaunch:
    """`hosts` of the allocation (its first nodes) through srun steps, ranks as srun tasks."""
    reached = replace(allocation, nodes=tuple(h.host for h in hosts))
    return NodeLaunch(SrunNodes(reached, dict(env)), SrunStart(allocation), tuple(hosts))

"""What the cross-node rules of `doctor --hostfile` see: every node's facts plus the head's own.

Kept apart from the rules and from the code that gathers it, so that the rules are pure functions of
data (unit-tested without ssh) and the registry can import them without importing ssh code.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds.cluster.nodeprobe import IFNAME_VARIABLES, NodeFacts
from mlstack_ds.doctor.bundle import BundleCoverage


@dataclass(frozen=True)
class ClusterInput:
    nodes: tuple[NodeFacts, ...]  # hostfile order, nodes with slots only
    python: Path  # the target interpreter, at the same path on every node
    tool: Path  # the interpreter running mlstack-ds here (install --hostfile runs it on every node)
    head_pdsh: str | None = None  # pdsh on this host (DeepSpeed's launcher starts the other nodes with it)
    head_env: Mapping[str, str] = field(default_factory=dict)  # this host's interface variables
    launcher: str = "pdsh"  # "srun" for `doctor --slurm`: the nodes were asked through one srun step
    rendezvous: tuple[str, int] | None = None  # --slurm: the host and port the ranks would meet at
    port_problem: str | None = None  # --slurm: why this host could not listen on that port (in use...)
    job_id: str | None = None  # --slurm: the allocation
    bundle: Mapping[str, BundleCoverage] = field(default_factory=dict)  # --offline DIR: each node's coverage

    @property
    def reachable(self) -> tuple[NodeFacts, ...]:
        return tuple(n for n in self.nodes if n.unreachable is None)

    def ifname_set(self, node: NodeFacts) -> dict[str, str]:
        """The interface variables a rank on `node` gets: this host's (verify forwards them; a user puts
        them into .deepspeed_env), else the node's own shell's."""
        return {v: (self.head_env.get(v) or node.ifname_env.get(v) or "") for v in IFNAME_VARIABLES
                if self.head_env.get(v) or node.ifname_env.get(v)}


def global_networks(node: NodeFacts) -> dict[str, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]:
    """{interface: its global-scope addresses} of a node, loopback left out."""
    found: dict[str, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = {}
    for address in node.addresses:
        if not address.loopback and address.scope == "global":
            found.setdefault(address.interface, []).append(ipaddress.ip_interface(address.address))
    return found


def peer_interfaces(node: NodeFacts, others: tuple[NodeFacts, ...]) -> list[str]:
    """The interfaces of `node` on a network that holds an address of another node: the ones the ranks
    can talk over."""
    peer_ips = [ipaddress.ip_interface(a.address).ip for o in others for a in o.addresses
                if not a.loopback and a.scope == "global"]
    return [name for name, nets in global_networks(node).items()
            if any(ip in net.network and ip != net.ip for net in nets for ip in peer_ips)]


def common_interface(nodes: tuple[NodeFacts, ...]) -> str | None:
    """One interface name every node reaches the others over (one GLOO_SOCKET_IFNAME fits all), if any."""
    per_node = [peer_interfaces(n, tuple(o for o in nodes if o is not n)) for n in nodes if n.addresses]
    if not per_node:
        return None
    common = [name for name in per_node[0] if all(name in names for names in per_node[1:])]
    return common[0] if common else None

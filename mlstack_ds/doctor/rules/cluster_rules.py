"""Across the nodes of a hostfile (`doctor --hostfile`): what makes a multi-node launch fail although
each node alone is fine. Each check is a pure function of `ClusterInput` (gathered over ssh elsewhere)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from mlstack_ds import gfx
from mlstack_ds.cluster.nodeprobe import NodeFacts
from mlstack_ds.cluster.remote import REACH_HINT
from mlstack_ds.doctor.cluster_input import ClusterInput, common_interface, global_networks, peer_interfaces
from mlstack_ds.doctor.model import Hit, Rule

NAMED_NODES = 3  # a finding names this many nodes per value, then counts the rest (think 100 nodes)
ENV_FILE_NOTE = ("   # and as NAME=value lines in ~/.deepspeed_env: DeepSpeed's launcher passes that file's "
                 "variables (and NCCL_*, PYTHON*...) to the other nodes, not the rest; verify forwards them itself")


def _names(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:NAMED_NODES])
    return shown + (f" and {len(hosts) - NAMED_NODES} more" if len(hosts) > NAMED_NODES else "")


def _grouped(values: dict[str, str]) -> str:
    """{host: value} -> `value1 on a, b; value2 on c` (values in order of first appearance)."""
    by_value: dict[str, list[str]] = {}
    for host, value in values.items():
        by_value.setdefault(value, []).append(host)
    return "; ".join(f"{value} on {_names(hosts)}" for value, hosts in by_value.items())


def unreachable_nodes(inp: ClusterInput) -> Hit | None:
    gone = [n for n in inp.nodes if n.unreachable is not None]
    if not gone:
        return None
    more = len(gone) - NAMED_NODES
    return Hit("; ".join(f"{n.host}: {n.unreachable}" for n in gone[:NAMED_NODES])
               + (f"; and {more} more nodes (each on its status line, and in --json)" if more > 0 else ""),
               fix=tuple(REACH_HINT.format(host=n.host) for n in gone[:NAMED_NODES]))


def python_missing(inp: ClusterInput) -> Hit | None:
    missing = [n.host for n in inp.reachable if n.python_present is False]
    if not missing:
        return None
    return Hit(f"no executable {inp.python} on {_names(missing)}")


def tool_missing(inp: ClusterInput) -> Hit | None:
    missing = [n.host for n in inp.reachable if n.tool_present is False]
    if not missing:
        return None
    return Hit(f"no executable {inp.tool} (the Python running mlstack-ds here) on {_names(missing)}")


def probe_failed(inp: ClusterInput) -> Hit | None:
    broken = [(n.host, n.target.problem or n.target.torch_error) for n in inp.reachable
              if n.target is not None and (n.target.problem or n.target.torch_error)]
    if not broken:
        return None
    return Hit("; ".join(f"{host}: {why}" for host, why in broken[:NAMED_NODES])
               + (f"; and {len(broken) - NAMED_NODES} more nodes" if len(broken) > NAMED_NODES else ""),
               fix=(f"ssh {broken[0][0]} {inp.python} -c 'import torch, deepspeed'   # see the error there",
                    "repair or recreate the environment on that node at the same path"))


def pdsh_missing(inp: ClusterInput) -> Hit | None:
    if inp.head_pdsh or len(inp.nodes) < 2 or inp.launcher != "pdsh":
        return None
    return Hit(f"no pdsh on PATH of this host; the hostfile has {len(inp.nodes)} nodes")


def _answered(inp: ClusterInput) -> list[NodeFacts]:
    return [n for n in inp.reachable if n.target is not None and n.target.answered]


def _components(node: NodeFacts) -> dict[str, str]:
    target = node.target
    assert target is not None
    torch = target.torch
    return {
        "Python": target.python.version,
        "torch": torch.version if torch else (target.torch_version or "not installed"),
        "HIP (torch)": (torch.hip or "none") if torch else "?",
        "CUDA (torch)": (torch.cuda or "none") if torch else "?",
        "DeepSpeed": target.deepspeed.version if target.deepspeed else "not installed",
        "ROCm": node.rocm_version or "none",
        "mlstack-ds receipt": node.receipt.text() if node.receipt else "none",
    }


def versions_differ(inp: ClusterInput) -> Hit | None:
    nodes = _answered(inp)
    if len(nodes) < 2:
        return None
    table = {n.host: _components(n) for n in nodes}
    differing = []
    for component in table[nodes[0].host]:
        values = {host: parts[component] for host, parts in table.items() if parts[component] != "?"}
        if len(set(values.values())) > 1:
            differing.append(f"{component}: {_grouped(values)}")
    if not differing:
        return None
    return Hit(" | ".join(differing))


def archs_differ(inp: ClusterInput) -> Hit | None:
    with_gpus = [n for n in _answered(inp) if n.target and n.target.torch and n.target.torch.hip is not None]
    archs = {n.host: n.gpu_archs for n in with_gpus}
    if not any(archs.values()):
        return None
    sets = {host: ";".join(a) or "no GPU" for host, a in archs.items()}
    waves = gfx.wavefront_groups((arch, f"{arch} on {host}") for host, node_archs in archs.items()
                                 for arch in node_archs)
    if len(waves) > 1:
        mix = ", ".join(f"wave{size}: {_names(sorted(set(where)))}"
                        for size, where in sorted(waves.items(), reverse=True))
        return Hit(f"GPU targets {_grouped(sets)}; mixes wavefront sizes ({mix})", severity="error",
                   fix=("split the hostfile: one job per wavefront size (CDNA gfx9xx is wave64, RDNA "
                        "gfx10xx/11xx/12xx wave32)",
                        "DeepSpeed compiles its ROCm ops with one -DROCM_WAVEFRONT_SIZE: one build cannot serve both"))
    if len(set(sets.values())) < 2:
        return None
    every = gfx.sorted_archs({a for node_archs in archs.values() for a in node_archs})
    return Hit(f"GPU targets {_grouped(sets)}",
               fix=(f"build for every node's targets: mlstack-ds install --arch {','.join(every)} "
                    "(or PYTORCH_ROCM_ARCH) on every node",
                    "check the installed torch wheel covers all of them (doctor on each node: MLS-ARCH-001)"))


def _gloo_address(node: NodeFacts) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address gloo would take from the node's hostname: the first one it resolves to that can be bound
    there (an address of the node, or any loopback address); None: gloo falls back to loopback."""
    own = {ipaddress.ip_interface(a.address).ip for a in node.addresses}
    for text in node.resolved:
        address = ipaddress.ip_address(text)
        if address.is_loopback or address in own:
            return address
    return None


def _resolution_problem(node: NodeFacts) -> str | None:
    if node.hostname is None:
        return None
    prefix = f"{node.host}: its hostname {node.hostname}"
    if not node.resolved:
        return f"{prefix} resolves to no address there"
    if not node.addresses:  # no `ip` there: which addresses are the node's own is unknown
        return None
    chosen = _gloo_address(node)
    if chosen is None:
        return f"{prefix} resolves to {', '.join(node.resolved)}, not an address of that node"
    if chosen.is_loopback:
        return f"{prefix} resolves first to loopback {chosen}"
    return None


def _interface_fix(inp: ClusterInput, nodes: Sequence[NodeFacts]) -> tuple[str, str]:
    """(the interface to name, a note on which one each node would use when there is no common name)."""
    common = common_interface(inp.reachable)
    if common:
        return common, ""
    per_node = [f"{n.host}: {', '.join(peer_interfaces(n, tuple(o for o in inp.reachable if o is not n))) or '?'}"
                for n in nodes[:NAMED_NODES]]
    return "<interface>", f"   # the interface on the nodes' network ({'; '.join(per_node)})"


def hostname_not_own(inp: ClusterInput) -> Hit | None:
    if len(inp.reachable) < 2:
        return None
    bad = [(n, why) for n in inp.reachable if not inp.ifname_set(n).get("GLOO_SOCKET_IFNAME")
           for why in (_resolution_problem(n),) if why]
    if not bad:
        return None
    iface, note = _interface_fix(inp, [n for n, _ in bad])
    fix = [f"export GLOO_SOCKET_IFNAME={iface}{note or ENV_FILE_NOTE}"]
    for node, _why in bad[:NAMED_NODES]:
        nets = global_networks(node).get(iface) or next(iter(global_networks(node).values()), [])
        if not nets or not node.hostname:
            continue
        line = f"{nets[0].ip} {node.hostname}"
        chosen = _gloo_address(node)
        fix.append(f"or on {node.host}: replace the /etc/hosts line `{chosen} {node.hostname}` by `{line}`"
                   if chosen is not None else f"or on {node.host}: echo '{line}' >> /etc/hosts")
    return Hit("; ".join(why for _n, why in bad[:NAMED_NODES])
               + (f"; and {len(bad) - NAMED_NODES} more nodes" if len(bad) > NAMED_NODES else ""), fix=tuple(fix))


def many_interfaces_unset(inp: ClusterInput) -> Hit | None:
    if len(inp.reachable) < 2:
        return None
    crowded = [(n, sorted(global_networks(n))) for n in inp.reachable if not inp.ifname_set(n)]
    crowded = [(n, names) for n, names in crowded if len(names) > 1]
    if not crowded:
        return None
    iface, note = _interface_fix(inp, [n for n, _ in crowded])
    return Hit("; ".join(f"{n.host}: {', '.join(names)}" for n, names in crowded[:NAMED_NODES])
               + "; neither GLOO_SOCKET_IFNAME nor NCCL_SOCKET_IFNAME is set",
               fix=(f"export GLOO_SOCKET_IFNAME={iface} NCCL_SOCKET_IFNAME={iface}{note or ENV_FILE_NOTE}",))


HOSTNAME_SYMPTOM = (
    "torch's gloo binds to the address the node's own hostname resolves to; when that is no address of the "
    "node (or there is none) it warns `Unable to resolve hostname to a (local) address. Using the loopback "
    "address as fallback.` and, when the first address is loopback (Debian's `127.0.1.1 host` line), uses "
    "that: the other "
    "nodes are told to connect to 127.0.0.x and the rendezvous fails with `RuntimeError: Gloo connectFullMesh "
    "failed with [.../gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
    "remote=[127.0.0.1]:7574` (the rank that listens: `... Connect timeout [none]`).")

RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-MN-001",
        severity="error",
        title="A node of the hostfile is not reachable over ssh",
        symptom="DeepSpeed's launcher checks every node with `ssh <node> hostname` and starts its ranks with pdsh over "
        "ssh: a node ssh cannot reach (refused, no route, no key, a password prompt under BatchMode) fails "
        "the launch.",
        fix=(REACH_HINT.format(host="<node>"), "or remove the node from the hostfile"),
        source="DeepSpeed 0.19.5 deepspeed/launcher/runner.py (the `ssh ... hostname` check, PDSHRunner)",
        cluster_check=unreachable_nodes,
    ),
    Rule(
        id="MLS-MN-002",
        severity="error",
        title="The target Python is missing on a node",
        symptom="DeepSpeed's launcher runs `cd <cwd>; <this python> -m deepspeed.launcher.launch ...` on every node: "
        "the same interpreter path must exist everywhere, or that node's ranks never start.",
        fix=("create the environment at the same path on that node (or put it on a shared file system)",),
        source="DeepSpeed 0.19.5 deepspeed/launcher/multinode_runner.py (PDSHRunner.get_cmd: sys.executable)",
        cluster_check=python_missing,
    ),
    Rule(
        id="MLS-MN-003",
        severity="warning",
        title="mlstack-ds itself is missing on a node",
        symptom="`mlstack-ds install --hostfile` runs this mlstack-ds (its interpreter, same path) on every node "
        "to install there; a node without it cannot be installed from here.",
        fix=("install mlstack-ds at the same path on that node (or run it from a shared file system)",),
        source="mlstack-ds install --hostfile (issue 15)",
        cluster_check=tool_missing,
    ),
    Rule(
        id="MLS-MN-004",
        severity="error",
        title="The target Python does not work on a node",
        symptom="The interpreter exists on the node but did not answer the probe, or its torch does not import: "
        "that node's ranks would die at start.",
        fix=("ssh <node> <python> -c 'import torch, deepspeed'   # see the error there",
             "repair or recreate the environment on that node at the same path"),
        source="the target probe (detect/target_probe.py) run on the node",
        cluster_check=probe_failed,
    ),
    Rule(
        id="MLS-MN-005",
        severity="error",
        title="pdsh is missing on this host",
        symptom="DeepSpeed's launcher starts the ranks of a multi-node hostfile through pdsh (its default launcher): "
        "`RuntimeError: launcher 'pdsh' not installed.`",
        fix=("install it (Debian/Ubuntu: apt-get install pdsh; RHEL: dnf install pdsh)",),
        source="DeepSpeed 0.19.5 deepspeed/launcher/runner.py (`launcher ... not installed`)",
        cluster_check=pdsh_missing,
    ),
    Rule(
        id="MLS-MN-006",
        severity="error",
        title="Versions differ between nodes",
        symptom="Ranks built from different torch, DeepSpeed, ROCm/HIP or Python versions disagree on wire formats, "
        "op builds and defaults: hangs in the first collective, `version mismatch` errors, or silently "
        "different numerics.",
        fix=("make every node's environment the same: one environment on a shared file system, or the same "
             "versions installed on each node (pip install torch==<version> ...; mlstack-ds install on each)",),
        source="mlstack-ds verify --hostfile (one build per cluster); DeepSpeed's launcher assumes identical nodes",
        cluster_check=versions_differ,
    ),
    Rule(
        id="MLS-MN-007",
        severity="warning",
        title="GPU targets differ between nodes",
        symptom="One DeepSpeed build serves every node: its ops and torch's kernels must cover every node's GPU "
        "target (`invalid device function` / `no kernel image` on the node that was left out). Mixing "
        "wavefront sizes (wave64 CDNA gfx90a/gfx942 with wave32 RDNA gfx1100) cannot work: DeepSpeed "
        "compiles its ROCm ops with one -DROCM_WAVEFRONT_SIZE.",
        fix=("build for every node's targets: mlstack-ds install --arch <every target, comma-separated>",
             "mixed wavefront sizes: one job per wavefront size"),
        source="DeepSpeed 0.19.5 op_builder/builder.py (get_rocm_wavefront_size, -DROCM_WAVEFRONT_SIZE); "
        "mlstack_ds/gfx_targets.toml",
        cluster_check=archs_differ,
        severity_note="error when the nodes mix wavefront sizes",
    ),
    Rule(
        id="MLS-NET-004",
        severity="error",
        title="A node's hostname does not resolve to an address of its own",
        symptom=HOSTNAME_SYMPTOM,
        fix=("export GLOO_SOCKET_IFNAME=<interface on the nodes' network>" + ENV_FILE_NOTE,
             "or on that node: echo '<its address> <its hostname>' >> /etc/hosts"),
        source="measured here: verify --hostfile on two network-namespace nodes that kept this machine's hostname "
        "(tests/support/two_hosts.py own_hostnames=False), and a bare two-rank gloo all_reduce there "
        "(tests/fixtures/doctor-logs/SOURCES.md), which GLOO_SOCKET_IFNAME=<the shared interface> fixes; the "
        "same all_reduce with `127.0.1.1 <hostname>` first in the hosts file fails towards 127.0.1.1; "
        "torch ProcessGroupGloo createDefaultDevice (hostname, else loopback)",
        cluster_check=hostname_not_own,
        log_patterns=(re.compile(r"Unable to resolve hostname to a \(local\) address"),
                      re.compile(r"Gloo connectFullMesh failed with .*remote=\[127\.")),
    ),
    Rule(
        id="MLS-NET-005",
        severity="warning",
        title="Several network interfaces and no GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME",
        symptom="With more than one non-loopback interface (a docker0 bridge, a management and a fast network) NCCL/"
        "RCCL and gloo may pick one the other nodes cannot reach, or the slow one: hangs at the first "
        "collective or `Connection refused`/`No route to host`.",
        fix=("export GLOO_SOCKET_IFNAME=<interface> NCCL_SOCKET_IFNAME=<interface>" + ENV_FILE_NOTE,),
        source="NCCL/RCCL and gloo interface selection (their NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME variables)",
        cluster_check=many_interfaces_unset,
    ),
)

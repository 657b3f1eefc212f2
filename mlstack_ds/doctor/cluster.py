"""`doctor --hostfile`: every node of a hostfile asked over ssh (in parallel, one round trip each), then
the cross-node rules. An unreachable node is a finding, not a failure: the other nodes are still checked."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds import runner
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.nodeprobe import IFNAME_VARIABLES, NodeFacts, probe_node
from mlstack_ds.doctor.cluster_input import ClusterInput
from mlstack_ds.doctor.model import Finding, Rule, sort_findings
from mlstack_ds.doctor.rules import RULES


@dataclass(frozen=True)
class ClusterDiagnosis:
    hostfile: Path
    input: ClusterInput
    findings: list[Finding]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        inp = self.input
        return {"hostfile": str(self.hostfile), "python": str(inp.python), "mlstack_ds_python": str(inp.tool),
                "head": {"pdsh": inp.head_pdsh, "interface_variables": dict(inp.head_env)},
                "nodes": [n.to_json() for n in inp.nodes], "findings": [f.to_dict() for f in self.findings]}


def run_cluster_rules(inp: ClusterInput, rules: Iterable[Rule] = RULES) -> list[Finding]:
    findings = []
    for rule in rules:
        hit = rule.cluster_check(inp) if rule.cluster_check else None
        if hit is not None:
            findings.append(rule.finding(hit))
    return sort_findings(findings)


def node_status(node: NodeFacts, python: Path) -> str:
    """The one progress line of a node."""
    if node.unreachable is not None:
        return f"{node.host}: not reachable over ssh: {node.unreachable}"
    if node.python_present is False:
        return f"{node.host}: reachable; no {python} there"
    target = node.target
    if target is None or not target.answered:
        return f"{node.host}: reachable; {python} did not answer: {target.problem if target else 'no output'}"
    torch = target.torch
    kind = "" if torch is None else f" (HIP {torch.hip})" if torch.hip else f" (CUDA {torch.cuda})" if torch.cuda \
        else " (CPU)"
    parts = [f"Python {target.python.version}",
             f"torch {torch.version}{kind}" if torch else "no torch",
             f"DeepSpeed {target.deepspeed.version}" if target.deepspeed else "no DeepSpeed"]
    if node.gpu_archs:
        parts.append("GPUs " + ";".join(node.gpu_archs))
    return f"{node.host}: reachable; " + ", ".join(parts)


def diagnose_cluster(hostfile: Path, hosts: list[HostEntry], python: Path, *, tool: Path | None = None,
                     env: Mapping[str, str] | None = None,
                     status: Callable[[str], None] = lambda _m: None) -> ClusterDiagnosis:
    """Probe every host with slots (a status line each as it answers; the facts in hostfile order), then
    the rules."""
    environ = dict(os.environ if env is None else env)
    tool = tool or Path(sys.executable)
    names = [h.host for h in hosts if h.slots > 0]

    def probe(host: str) -> NodeFacts:
        return probe_node(host, python, tool, env=env)

    # a status line as each node answers, slow ones last; the facts in hostfile order
    nodes = on_each(names, probe, done=lambda _host, node: status(node_status(node, python)),
                    kill_on_interrupt=True)
    pdsh = runner.which("pdsh", path=environ.get("PATH"))
    inp = ClusterInput(nodes=tuple(nodes), python=python, tool=tool, head_pdsh=str(pdsh) if pdsh else None,
                       head_env={v: environ[v] for v in IFNAME_VARIABLES if environ.get(v)})
    return ClusterDiagnosis(hostfile, inp, run_cluster_rules(inp))

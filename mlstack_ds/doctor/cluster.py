"""`doctor --hostfile`: every node of a hostfile asked over ssh (in parallel, one round trip each), then
the cross-node rules. An unreachable node is a finding, not a failure: the other nodes are still checked."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds import runner
from mlstack_ds.cluster import srun_steps as srun
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.nodeprobe import (
    IFNAME_VARIABLES,
    NODE_TIMEOUT_S,
    NodeFacts,
    node_script,
    parse_node_output,
    probe_node,
)
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.doctor.bundle import BundleCoverage, BundleQuestion, covered_note, nodes_coverage
from mlstack_ds.doctor.cluster_input import ClusterInput
from mlstack_ds.doctor.model import Finding, Rule, sort_findings
from mlstack_ds.doctor.rules import RULES
from mlstack_ds.errors import ToolTimedOut
from mlstack_ds.launch import launcher


@dataclass(frozen=True)
class ClusterDiagnosis:
    hostfile: Path | None  # None: `--slurm`, the allocation's nodes
    input: ClusterInput
    findings: list[Finding]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        inp = self.input
        where: dict[str, Any] = ({"hostfile": str(self.hostfile)} if self.hostfile is not None else {
            "slurm": {"job_id": inp.job_id, "launcher": inp.launcher,
                      "rendezvous": None if inp.rendezvous is None else
                      {"host": inp.rendezvous[0], "port": inp.rendezvous[1], "listen_problem": inp.port_problem}}})
        return {**where, "python": str(inp.python), "mlstack_ds_python": str(inp.tool),
                "head": {"pdsh": inp.head_pdsh, "interface_variables": dict(inp.head_env)},
                "nodes": [n.to_json() for n in inp.nodes], "findings": [f.to_dict() for f in self.findings],
                **({"offline": {host: c.to_dict() for host, c in inp.bundle.items()}} if inp.bundle else {})}


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
                     env: Mapping[str, str] | None = None, bundle: BundleQuestion | None = None,
                     status: Callable[[str], None] = lambda _m: None) -> ClusterDiagnosis:
    """Probe every host with slots (a status line each as it answers; the facts in hostfile order), then
    the rules."""
    environ = dict(os.environ if env is None else env)
    tool = tool or Path(sys.executable)
    names = [h.host for h in hosts if h.slots > 0]

    def probe(host: str) -> NodeFacts:
        return probe_node(host, python, tool, env=env, bundle=bundle.directory if bundle else None)

    # a status line as each node answers, slow ones last; the facts in hostfile order
    nodes = on_each(names, probe, done=lambda _host, node: status(node_status(node, python)),
                    kill_on_interrupt=True)
    pdsh = runner.which("pdsh", path=environ.get("PATH"))
    inp = ClusterInput(nodes=tuple(nodes), python=python, tool=tool, head_pdsh=str(pdsh) if pdsh else None,
                       head_env={v: environ[v] for v in IFNAME_VARIABLES if environ.get(v)},
                       bundle=bundle_on_nodes(nodes, bundle, status))
    return ClusterDiagnosis(hostfile, inp, run_cluster_rules(inp))


def diagnose_slurm(allocation: Allocation, python: Path, *, tool: Path | None = None,
                   env: Mapping[str, str] | None = None, bundle: BundleQuestion | None = None,
                   status: Callable[[str], None] = lambda _m: None) -> ClusterDiagnosis:
    """`doctor --slurm`: every allocated node asked at once by one srun step (one task per node, the same
    script `--hostfile` sends over ssh, plus the task's device/thread variables, the rendezvous host's
    resolution and a TCP connect to a port this host listens on), then the cluster and Slurm rules."""
    environ = dict(os.environ if env is None else env)
    tool = tool or Path(sys.executable)
    srun.find_srun(environ)  # no srun: the usage error comes before a port is taken
    port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT", "").isdigit() else launcher.free_port("0.0.0.0")
    rendezvous = (socket.gethostname() if socket.gethostname() not in allocation.nodes else allocation.nodes[0], port)
    with _listening(port) as port_problem:
        try:
            answers, result = srun.on_each_node(
                allocation, list(allocation.nodes), ["sh", "-s"],
                input_text=node_script(python, tool, rendezvous, bundle.directory if bundle else None),
                timeout_s=NODE_TIMEOUT_S * 2, env=environ, name=f"{launcher.new_run_id()}-doctor")
            code: int | None = result.returncode
        except ToolTimedOut:
            answers, code = {}, None
    nodes = []
    for host in allocation.nodes:
        if host not in answers:
            node = NodeFacts(host, unreachable="its srun task did not answer" + (
                f" (srun exit {code})" if code is not None else f" within {NODE_TIMEOUT_S * 2:g} s"))
        else:
            node = parse_node_output(host, answers[host], python)
        status(node_status(node, python).replace("not reachable over ssh", "no answer from srun"))
        nodes.append(node)
    inp = ClusterInput(nodes=tuple(nodes), python=python, tool=tool, head_pdsh=None,
                       head_env={v: environ[v] for v in IFNAME_VARIABLES if environ.get(v)}, launcher="srun",
                       rendezvous=rendezvous, port_problem=port_problem, job_id=allocation.job_id,
                       bundle=bundle_on_nodes(nodes, bundle, status))
    return ClusterDiagnosis(None, inp, run_cluster_rules(inp))


def bundle_on_nodes(nodes: list[NodeFacts], bundle: BundleQuestion | None, status: Callable[[str], None]
                    ) -> dict[str, BundleCoverage]:
    """`--offline DIR`: each node's coverage (a status line for each node it covers; the others are a finding)."""
    if bundle is None:
        return {}
    found = nodes_coverage(nodes, bundle)
    for host, coverage in found.items():
        if coverage.covered:
            status(f"{host}: {covered_note(coverage, bundle.recipe, 'there')}")
    return found


@contextlib.contextmanager
def _listening(port: int) -> Iterator[str | None]:
    """A socket listening on `port` (all addresses) for the block; yields why it could not, or None. The
    kernel completes the tasks' connects from the backlog: nothing needs to accept them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(("0.0.0.0", port))
            sock.listen(128)
        except OSError as exc:
            yield exc.strerror or str(exc)
            return
        yield None
    finally:
        sock.close()

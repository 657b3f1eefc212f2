"""`doctor --hostfile`: every node of a hostfile asked over ssh (in parallel, one round trip each), then
the cross-node rules. An unreachable node is a finding, not a failure: the other nodes are still checked.
`doctor --slurm` asks the allocation's nodes the same, through one srun step (cluster/transport.py: the
nodes are asked once, whichever way they are reached), and adds what only a Slurm task shows."""

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
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.nodeprobe import (
    IFNAME_VARIABLES,
    SECTION,
    NodeFacts,
    node_script,
    parse_node_output,
)
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_nodes import SrunNodes
from mlstack_ds.cluster.srun_steps import find_srun
from mlstack_ds.cluster.ssh_nodes import SshNodes
from mlstack_ds.cluster.transport import NodeTransport, ScriptAnswer
from mlstack_ds.doctor.bundle import BundleCoverage, BundleQuestion, covered_note, nodes_coverage
from mlstack_ds.doctor.cluster_input import ClusterInput
from mlstack_ds.doctor.model import Finding, Rule, sort_findings
from mlstack_ds.doctor.rules import RULES
from mlstack_ds.launch import launcher
from mlstack_ds.patience import WAITS


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


def node_status(node: NodeFacts, python: Path, no_answer: str = "not reachable over ssh") -> str:
    """The one progress line of a node (`no_answer`: the transport's words for a node that ran nothing)."""
    if node.unreachable is not None:
        return f"{node.host}: {no_answer}: {node.unreachable}"
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


def ask_nodes(nodes: NodeTransport, python: Path, tool: Path, *, bundle: BundleQuestion | None,
              status: Callable[[str], None], rendezvous: tuple[str, int] | None = None) -> list[NodeFacts]:
    """Every node's facts from one script run there (a status line as each answers; the facts in host order)."""
    def facts(answer: ScriptAnswer) -> NodeFacts:
        if answer.unreachable is not None:
            return NodeFacts(answer.host, unreachable=answer.unreachable)
        if answer.timed_out and SECTION not in answer.stdout:  # the script printed nothing of its own
            return NodeFacts(answer.host, unreachable=answer.interrupted)
        return parse_node_output(answer.host, answer.stdout, python, interrupted=answer.interrupted)

    answers = nodes.script_on_each(node_script(python, tool, rendezvous, bundle.directory if bundle else None),
                                   patience=WAITS["node probe"],
                                   done=lambda answer: status(node_status(facts(answer), python, nodes.no_answer)))
    return [facts(answer) for answer in answers]


def diagnose_cluster(hostfile: Path, hosts: list[HostEntry], python: Path, *, tool: Path | None = None,
                     env: Mapping[str, str] | None = None, bundle: BundleQuestion | None = None,
                     status: Callable[[str], None] = lambda _m: None) -> ClusterDiagnosis:
    """Probe every host with slots over ssh, then the rules."""
    environ = dict(os.environ if env is None else env)
    tool = tool or Path(sys.executable)
    nodes = ask_nodes(SshNodes(tuple(h for h in hosts if h.slots > 0), env=env), python, tool, bundle=bundle,
                      status=status)
    pdsh = runner.which("pdsh", path=environ.get("PATH"))
    inp = ClusterInput(nodes=tuple(nodes), python=python, tool=tool, head_pdsh=str(pdsh) if pdsh else None,
                       head_env=interface_variables(environ), bundle=bundle_on_nodes(nodes, bundle, status))
    return ClusterDiagnosis(hostfile, inp, run_cluster_rules(inp))


def diagnose_slurm(allocation: Allocation, python: Path, *, tool: Path | None = None,
                   env: Mapping[str, str] | None = None, bundle: BundleQuestion | None = None,
                   status: Callable[[str], None] = lambda _m: None) -> ClusterDiagnosis:
    """`doctor --slurm`: the nodes asked as with `--hostfile`, as srun tasks, plus what only a task shows: its
    device/thread variables, the rendezvous host's resolution and a TCP connect to a port this host listens
    on; then the cluster and Slurm rules."""
    environ = dict(os.environ if env is None else env)
    tool = tool or Path(sys.executable)
    find_srun(environ)  # no srun: the usage error comes before a port is taken
    port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT", "").isdigit() else launcher.free_port("0.0.0.0")
    rendezvous = (socket.gethostname() if socket.gethostname() not in allocation.nodes else allocation.nodes[0], port)
    with _listening(port) as port_problem:
        nodes = ask_nodes(SrunNodes(allocation, environ), python, tool, bundle=bundle, status=status,
                          rendezvous=rendezvous)
    inp = ClusterInput(nodes=tuple(nodes), python=python, tool=tool, head_pdsh=None,
                       head_env=interface_variables(environ), launcher="srun", rendezvous=rendezvous,
                       port_problem=port_problem, job_id=allocation.job_id,
                       bundle=bundle_on_nodes(nodes, bundle, status))
    return ClusterDiagnosis(None, inp, run_cluster_rules(inp))


def interface_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The head's gloo/NCCL interface choice, which the ranks inherit."""
    return {v: environ[v] for v in IFNAME_VARIABLES if environ.get(v)}


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

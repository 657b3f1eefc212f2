"""`doctor --hostfile`'s pure parts: the node script (run here by a real `sh -s`, as ssh runs it there),
its parsers, and every cross-node rule on node facts built for the case."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging import tags
from support.target_env import bare_venv

from mlstack_ds import runner
from mlstack_ds.cluster.heartbeat import BEAT
from mlstack_ds.cluster.nodeprobe import (
    InterfaceAddress,
    NodeFacts,
    ReceiptSummary,
    node_script,
    parse_getent,
    parse_ip_addr,
    parse_node_output,
)
from mlstack_ds.cluster.transport import ScriptAnswer
from mlstack_ds.detect.model import DeepSpeedInfo, PythonInfo, TorchDevice, TorchInfo
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.doctor.bundle import SHARED_HINT, BundleCoverage
from mlstack_ds.doctor.cluster import ask_nodes, run_cluster_rules
from mlstack_ds.doctor.cluster_input import ClusterInput, common_interface
from mlstack_ds.doctor.model import Finding
from mlstack_ds.doctor.rules import RULES, rule_by_id
from mlstack_ds.errors import ToolStalled
from mlstack_ds.patience import WAITS, Patience

PYTHON = Path("/opt/venv/bin/python")
TOOL = Path("/opt/mlstack/bin/python")
IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: mls0    inet 10.213.77.2/24 scope global mls0\\       valid_lft forever preferred_lft forever
2: mls0    inet6 fe80::f86a:1fff:fee8:dae2/64 scope link tentative \\       valid_lft forever preferred_lft forever
3: docker0@if7    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever
"""


def addrs(*items: tuple[str, str]) -> tuple[InterfaceAddress, ...]:
    return (InterfaceAddress("lo", "127.0.0.1/8", "host"),
            *(InterfaceAddress(iface, address, "global") for iface, address in items))


def node(host: str, n: int, *, python: str = "3.11.7", torch: str | None = "2.13.0", hip: str | None = None,
         ds: str | None = "0.19.5", archs: tuple[str, ...] = (), hostname: str | None = None,
         resolved: tuple[str, ...] | None = None, extra: tuple[tuple[str, str], ...] = (),
         env: dict[str, str] | None = None) -> NodeFacts:
    torch_info = None if torch is None else TorchInfo(
        version=torch, hip=hip, cuda=None, arch_list=list(archs), device_count=len(archs),
        devices=[TorchDevice(f"GPU {i}", f"{a}:sramecc+:xnack-") for i, a in enumerate(archs)])
    target = TargetFacts(PythonInfo(str(PYTHON), python, prefix="/opt/venv"), answered=True,
                         deepspeed=DeepSpeedInfo(ds, "/opt/venv/lib") if ds else None, torch_probed=True,
                         torch=torch_info)
    return NodeFacts(host, hostname=hostname or host, resolved=resolved if resolved is not None else (f"10.0.0.{n}",),
                     addresses=addrs(("eth0", f"10.0.0.{n}/24"), *extra), ifname_env=env or {}, tool_present=True,
                     python_present=True, target=target)


def cluster(*nodes: NodeFacts, pdsh: str | None = "/usr/bin/pdsh", head_env: dict[str, str] | None = None
            ) -> ClusterInput:
    return ClusterInput(nodes=nodes, python=PYTHON, tool=TOOL, head_pdsh=pdsh, head_env=head_env or {})


def findings(inp: ClusterInput) -> dict[str, Finding]:
    return {f.rule_id: f for f in run_cluster_rules(inp)}


HEALTHY = cluster(node("n1", 1), node("n2", 2))


def slurm_input(*nodes: NodeFacts, port_problem: str | None = None) -> ClusterInput:
    """`doctor --slurm`'s input: the nodes asked through srun, rank 0's node n1 the rendezvous."""
    return ClusterInput(nodes=nodes, python=PYTHON, tool=TOOL, head_pdsh=None, launcher="srun",
                        rendezvous=("n1", 29500), port_problem=port_problem, job_id="7")


def task(facts: NodeFacts, resolved: str = "10.0.0.1", port: str = "ok", **env: str) -> NodeFacts:
    """`facts` as a Slurm task saw them: 8 CPUs per task unless `env` says otherwise."""
    return replace(facts, task_env={"SLURM_CPUS_PER_TASK": "8", **env}, rendezvous_resolved=(resolved,),
                   port_check=port)


SLURM_HEALTHY = slurm_input(task(node("n1", 1)), task(node("n2", 2)))

TRIGGERS: dict[str, Callable[[], ClusterInput]] = {
    "MLS-BUILD-008": lambda: replace(HEALTHY, bundle={"n2": BundleCoverage(
        Path("/srv/bundle"), None, "/srv/bundle is not a bundle there (no bundle.json at that path)", SHARED_HINT)}),
    "MLS-MN-001": lambda: cluster(node("n1", 1), NodeFacts("n3", unreachable="connect to host n3 port 22: "
                                                                             "Connection refused")),
    "MLS-MN-002": lambda: cluster(node("n1", 1), NodeFacts("n2", hostname="n2", python_present=False)),
    "MLS-MN-003": lambda: cluster(node("n1", 1), NodeFacts("n2", tool_present=False, python_present=True,
                                                           target=node("x", 2).target)),
    "MLS-MN-004": lambda: cluster(node("n1", 1), NodeFacts("n2", python_present=True, target=TargetFacts(
        PythonInfo(str(PYTHON), "3.11.7"), answered=True, torch_error="import torch failed: OSError: libamdhip64.so"))),
    "MLS-MN-005": lambda: cluster(node("n1", 1), node("n2", 2), pdsh=None),
    "MLS-MN-006": lambda: cluster(node("n1", 1), node("n2", 2, torch="2.12.0")),
    "MLS-MN-007": lambda: cluster(node("n1", 1, hip="6.2", archs=("gfx90a",)),
                                  node("n2", 2, hip="6.2", archs=("gfx942",))),
    "MLS-NET-004": lambda: cluster(node("n1", 1), node("n2", 2, hostname="vm", resolved=())),
    "MLS-NET-005": lambda: cluster(node("n1", 1), node("n2", 2, extra=(("docker0", "172.17.0.1/16"),))),
    "MLS-SLURM-001": lambda: slurm_input(task(node("n1", 1), ROCR_VISIBLE_DEVICES="0", HIP_VISIBLE_DEVICES="0"),
                                         task(node("n2", 2))),
    "MLS-SLURM-002": lambda: slurm_input(task(node("n1", 1), SLURM_CPUS_PER_TASK="1"), task(node("n2", 2))),
    "MLS-SLURM-003": lambda: slurm_input(task(node("n1", 1)), task(node("n2", 2), resolved="127.0.1.1")),
    "MLS-SLURM-004": lambda: slurm_input(task(node("n1", 1)), task(node("n2", 2), port="TimeoutError: timed out")),
}


def test_every_cluster_rule_has_a_trigger() -> None:
    assert set(TRIGGERS) == {r.id for r in RULES if r.cluster_check is not None}


def test_identical_healthy_nodes_have_no_findings() -> None:
    assert run_cluster_rules(HEALTHY) == []
    assert run_cluster_rules(SLURM_HEALTHY) == []  # no pdsh needed under srun either


def test_slurm_rendezvous_on_another_network_and_omp_threads() -> None:
    """The first node's name resolving to its address on a network the nodes do not share is an error too;
    OMP_NUM_THREADS set means the ranks use more than one core whatever --cpus-per-task says."""
    elsewhere = slurm_input(task(node("n1", 1, extra=(("mgmt0", "192.168.9.1/24"),)), resolved="192.168.9.1"),
                            task(node("n2", 2), resolved="192.168.9.1"))
    assert findings(elsewhere)["MLS-SLURM-003"].evidence.startswith(
        "n1: n1 resolves to 192.168.9.1, not an address of n1 on the network the nodes share (10.0.0.1)")
    threads = slurm_input(task(node("n1", 1), SLURM_CPUS_PER_TASK="1", OMP_NUM_THREADS="8"), task(node("n2", 2)))
    assert "MLS-SLURM-002" not in findings(threads)


@pytest.mark.parametrize("rule_id", sorted(TRIGGERS))
def test_cluster_rule_fires_with_evidence_and_fix(rule_id: str) -> None:
    found = findings(TRIGGERS[rule_id]())
    assert rule_id in found, f"{rule_id} did not fire; got {sorted(found)}"
    finding = found[rule_id]
    assert finding.title == rule_by_id(rule_id).title
    assert finding.evidence and finding.fix
    assert finding.docs == f"docs/troubleshooting.md#{rule_id.lower()}"


def test_many_unreachable_nodes_are_counted() -> None:
    gone = [NodeFacts(f"n{i}", unreachable="Connection timed out") for i in range(10)]
    evidence = findings(cluster(node("a", 1), *gone))["MLS-MN-001"].evidence
    assert evidence.endswith("n2: Connection timed out; and 7 more nodes (each on its status line, and in --json)")


def test_unreachable_node_names_it_and_ssh_reason() -> None:
    finding = findings(TRIGGERS["MLS-MN-001"]())["MLS-MN-001"]
    assert finding.severity == "error"
    assert finding.evidence == "n3: connect to host n3 port 22: Connection refused"
    assert "ssh -o BatchMode=yes n3 hostname" in finding.fix[0]


def test_version_differences_name_each_nodes_value() -> None:
    inp = cluster(node("n1", 1), node("n2", 2, torch="2.12.0", ds=None), node("n3", 3, python="3.12.1"))
    evidence = findings(inp)["MLS-MN-006"].evidence
    assert "torch: 2.13.0 on n1, n3; 2.12.0 on n2" in evidence
    assert "DeepSpeed: 0.19.5 on n1, n3; not installed on n2" in evidence
    assert "Python: 3.11.7 on n1, n2; 3.12.1 on n3" in evidence


def test_receipt_and_hip_differences_are_versions_too() -> None:
    a = node("n1", 1, hip="6.2.41133")
    b = node("n2", 2, hip="6.4.43482")
    b = NodeFacts(**{**b.__dict__, "receipt": ReceiptSummary("/opt/venv/share/mlstack-ds/receipt.json", "0.19.5",
                                                              ("gfx942",))})
    evidence = findings(cluster(a, b))["MLS-MN-006"].evidence
    assert "HIP (torch): 6.2.41133 on n1; 6.4.43482 on n2" in evidence
    assert "mlstack-ds receipt: none on n1; DeepSpeed 0.19.5 for gfx942 on n2" in evidence


def test_many_nodes_are_counted_not_listed() -> None:
    nodes = [node(f"n{i}", i) for i in range(1, 11)] + [node("odd", 99, torch="2.12.0")]
    evidence = findings(cluster(*nodes))["MLS-MN-006"].evidence
    assert evidence == "torch: 2.13.0 on n1, n2, n3 and 7 more; 2.12.0 on odd"


def test_same_wavefront_different_archs_is_a_warning_with_the_union_to_build() -> None:
    finding = findings(TRIGGERS["MLS-MN-007"]())["MLS-MN-007"]
    assert finding.severity == "warning"
    assert "gfx90a on n1; gfx942 on n2" in finding.evidence
    assert "--arch gfx90a,gfx942" in finding.fix[0]


def test_mixed_wavefront_sizes_are_an_error() -> None:
    inp = cluster(node("n1", 1, hip="6.2", archs=("gfx90a",)), node("n2", 2, hip="6.2", archs=("gfx1100",)))
    finding = findings(inp)["MLS-MN-007"]
    assert finding.severity == "error"
    assert "wave64: gfx90a on n1" in finding.evidence and "wave32: gfx1100 on n2" in finding.evidence


def test_same_archs_everywhere_and_cpu_nodes_are_silent() -> None:
    same = cluster(node("n1", 1, hip="6.2", archs=("gfx90a",)), node("n2", 2, hip="6.2", archs=("gfx90a",)))
    assert "MLS-MN-007" not in findings(same)
    assert "MLS-MN-007" not in findings(HEALTHY)


@pytest.mark.parametrize(("resolved", "says"), [
    ((), "resolves to no address there"),
    (("192.168.1.7",), "resolves to 192.168.1.7, not an address of that node"),
    (("127.0.1.1",), "resolves first to loopback 127.0.1.1"),  # Debian's /etc/hosts line for the hostname
    (("127.0.1.1", "10.0.0.2"), "resolves first to loopback 127.0.1.1"),  # gloo takes the first it can bind
])
def test_hostname_resolution_problems(resolved: tuple[str, ...], says: str) -> None:
    inp = cluster(node("n1", 1), node("n2", 2, hostname="vm", resolved=resolved))
    finding = findings(inp)["MLS-NET-004"]
    assert finding.evidence.startswith("n2: its hostname vm ")
    assert says in finding.evidence
    assert finding.fix[0].startswith("export GLOO_SOCKET_IFNAME=eth0 ")
    assert finding.fix[1] == ("or on n2: replace the /etc/hosts line `127.0.1.1 vm` by `10.0.0.2 vm`"
                              if resolved[:1] == ("127.0.1.1",) else "or on n2: echo '10.0.0.2 vm' >> /etc/hosts")


def test_hostname_resolving_first_to_an_own_address_is_fine() -> None:
    both = node("n2", 2, resolved=("10.0.0.2", "127.0.1.1"))
    assert "MLS-NET-004" not in findings(cluster(node("n1", 1), both))


def test_gloo_interface_set_here_or_there_silences_the_hostname_rule() -> None:
    bad = node("n2", 2, hostname="vm", resolved=())
    assert "MLS-NET-004" not in findings(cluster(node("n1", 1), bad, head_env={"GLOO_SOCKET_IFNAME": "eth0"}))
    there = NodeFacts(**{**bad.__dict__, "ifname_env": {"GLOO_SOCKET_IFNAME": "eth0"}})
    assert "MLS-NET-004" not in findings(cluster(node("n1", 1), there))


def test_single_node_has_no_network_findings() -> None:
    assert run_cluster_rules(cluster(node("n1", 1, hostname="vm", resolved=()))) == []


def test_many_interfaces_names_them_and_the_common_one() -> None:
    finding = findings(TRIGGERS["MLS-NET-005"]())["MLS-NET-005"]
    assert finding.evidence.startswith("n2: docker0, eth0; neither")
    assert finding.fix[0].startswith("export GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 ")
    quiet = TRIGGERS["MLS-NET-005"]()
    assert "MLS-NET-005" not in findings(cluster(*quiet.nodes, head_env={"NCCL_SOCKET_IFNAME": "eth0"}))


def test_common_interface_needs_a_shared_network() -> None:
    a = NodeFacts("a", addresses=addrs(("ib0", "10.1.0.1/16"), ("eth0", "192.168.0.1/24")))
    b = NodeFacts("b", addresses=addrs(("ib0", "10.1.0.2/16"), ("eth1", "192.168.5.1/24")))
    assert common_interface((a, b)) == "ib0"
    c = NodeFacts("c", addresses=addrs(("ib1", "10.1.0.3/16")))
    assert common_interface((a, b, c)) is None


def test_pdsh_is_not_needed_for_one_node() -> None:
    assert run_cluster_rules(cluster(node("n1", 1), pdsh=None)) == []


def test_parsers() -> None:
    assert parse_getent(["10.0.0.2       STREAM n2", "10.0.0.2       DGRAM", "fd00::2 STREAM n2", "junk"]) == (
        "10.0.0.2", "fd00::2")
    found = parse_ip_addr(IP_ADDR.splitlines())
    assert [(a.interface, a.address, a.scope) for a in found] == [
        ("lo", "127.0.0.1/8", "host"), ("lo", "::1/128", "host"), ("mls0", "10.213.77.2/24", "global"),
        ("mls0", "fe80::f86a:1fff:fee8:dae2/64", "link"), ("docker0", "172.17.0.1/16", "global")]


def run_script(python: Path, tool: Path, bundle: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The node script as ssh runs it there: `sh -s`, the script on stdin. The limit only catches a hang: the
    script imports torch, which took 111 s at a load of 25 (the probe's own ceiling, not a speed test)."""
    return subprocess.run(["sh", "-s"], input=node_script(python, tool, bundle=bundle), capture_output=True,
                          text=True, timeout=WAITS["target probe"].ceiling_s, check=True)


def test_node_script_runs_in_sh_and_parses(tmp_path: Path) -> None:
    """The script ssh would run, run here by `sh -s` with this interpreter as the target (no ssh)."""
    python = Path(sys.executable)
    result = run_script(python, python)
    facts = parse_node_output("here", result.stdout, python)
    assert facts.hostname and facts.tool_present and facts.python_present
    assert facts.target is not None and facts.target.answered
    assert facts.target.python.version == ".".join(map(str, sys.version_info[:3]))
    assert facts.target.torch_probed  # the second line came too (torch or its absence)
    assert any(a.loopback for a in facts.addresses)  # `ip -o addr` answered (lo is always there)


def fake_interpreter(path: Path, body: str) -> Path:
    """A "target python" that runs `body` instead of the probe it is given (a Python program, so that the
    probe process the node script watches is the one that works or hangs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_node_scripts_heartbeat_keeps_a_working_probe_and_stops_a_hung_one(tmp_path: Path) -> None:
    """ssh and srun sit idle while the node probes, so the head watches the script's stderr: a line each second
    the probe used CPU. A probe working past the stall time (a torch import under load) is answered; one that
    hangs (a driver, a lock: no CPU) is stopped after the stall time, not the 900 s ceiling (before: a fixed
    900 s for both, and 150 s before that, which a torch import under load outlasted)."""
    working = fake_interpreter(tmp_path / "working" / "python", "import time\nend = time.monotonic() + 8\n"
                               "while time.monotonic() < end:\n    sum(range(300000))\n    time.sleep(0.05)")
    rule = Patience(ceiling_s=600, stall_s=4)  # the table's 60 s without progress, scaled down
    with runner.run_in_background(["sh", "-s"], input_text=node_script(working, working), patience=rule,
                                  stall_on_stderr=True) as pending:
        result = pending.result()
    assert result.ok and result.duration_s >= 8 and BEAT in result.stderr.splitlines()
    hung = fake_interpreter(tmp_path / "hung" / "python", "import time\ntime.sleep(600)")
    started = time.monotonic()
    with runner.run_in_background(["sh", "-s"], input_text=node_script(hung, hung), patience=rule,
                                  stall_on_stderr=True) as pending, \
            pytest.raises(ToolStalled, match=r"made no progress for 4 s \(printed nothing\)"):
        pending.result()
    assert time.monotonic() - started < 120


def test_node_script_without_the_python(tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "bin" / "python"
    result = run_script(missing, missing)
    facts = parse_node_output("here", result.stdout, missing)
    assert facts.python_present is False and facts.tool_present is False and facts.target is None


def test_node_script_says_whether_the_node_sees_the_bundle_and_its_platform_tags(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}")
    missing = tmp_path / "no-venv" / "bin" / "python"  # no target: no torch import, the script is quick
    for where, seen in ((bundle, True), (tmp_path / "elsewhere", False)):
        facts = parse_node_output("here", run_script(missing, Path(sys.executable), bundle=where).stdout, missing)
        assert facts.bundle_seen is seen and facts.platform_tags == tuple(tags.platform_tags())
        assert facts.to_json()["bundle_seen"] is seen
    plain = parse_node_output("here", run_script(missing, Path(sys.executable)).stdout, missing)
    assert plain.bundle_seen is None and plain.platform_tags == () and "bundle_seen" not in plain.to_json()


def test_node_script_reads_the_receipt(tmp_path: Path) -> None:
    venv = bare_venv(tmp_path / "venv")
    receipt = venv / "share" / "mlstack-ds" / "receipt.json"
    receipt.parent.mkdir(parents=True)
    receipt.write_text("{not json")
    python = venv / "bin" / "python"
    result = run_script(python, python)
    facts = parse_node_output("here", result.stdout, python)
    assert facts.receipt is not None and facts.receipt.problem
    assert facts.receipt.text().startswith("unreadable (")


def test_a_probe_cut_off_by_the_time_out_keeps_what_came_before(tmp_path: Path) -> None:
    """What a node whose torch import hangs leaves: the real script's output up to the probe's first line."""
    python = Path(sys.executable)
    full = run_script(python, python).stdout
    cut = full[:full.index("MLSTACK_TARGET_TORCH:")]
    facts = parse_node_output("n2", cut, python, interrupted="no answer within 150 s")
    assert facts.hostname and facts.addresses and facts.target is not None and facts.target.answered
    assert facts.target.torch_error == "torch probe: no answer within 150 s"
    finding = findings(cluster(node("n1", 1), facts))["MLS-MN-004"]
    assert finding.evidence == "n2: torch probe: no answer within 150 s"


def test_the_nodes_are_asked_once_whichever_transport_reaches_them() -> None:
    """`ask_nodes` over any transport: a node that ran nothing, or was cut off before its script printed a
    section, is unreachable in the transport's words; one cut off later keeps what it printed."""
    python = Path(sys.executable)
    full = run_script(python, python).stdout
    late = "no answer within 150 s"
    answers = [ScriptAnswer("n1", full), ScriptAnswer("n2", "", unreachable="its srun task did not answer"),
               ScriptAnswer("n3", "", interrupted=late, timed_out=True),
               ScriptAnswer("n4", full[:full.index("MLSTACK_TARGET_TORCH:")], interrupted=late, timed_out=True)]

    def script_on_each(script: str, *, patience: Patience, done: Callable[[ScriptAnswer], None]) -> list[ScriptAnswer]:
        assert script == node_script(python, python) and patience == WAITS["node probe"]
        for answer in answers:
            done(answer)
        return answers

    lines: list[str] = []
    transport = SimpleNamespace(no_answer="no answer from srun", script_on_each=script_on_each)
    facts = ask_nodes(transport, python, python, bundle=None, status=lines.append)  # type: ignore[arg-type]
    assert [f.unreachable for f in facts] == [None, "its srun task did not answer", late, None]
    assert lines[1:3] == ["n2: no answer from srun: its srun task did not answer", f"n3: no answer from srun: {late}"]
    assert facts[3].target is not None and facts[3].target.torch_error == f"torch probe: {late}"

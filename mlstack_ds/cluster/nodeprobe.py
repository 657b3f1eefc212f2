"""What `doctor --hostfile` needs to know about one node, asked in one ssh round trip.

Why one round trip: a cluster has hundreds of nodes and each ssh connection costs a handshake, so one
`sh -s` per node gets everything at once from a script on stdin: the node's hostname and what it resolves
to there (`getent ahosts`, the lookup glibc's getaddrinfo does, which is how gloo picks its address), its
interface addresses (`ip -o addr`), the interface variables its shell sets, its ROCm version file, whether
mlstack-ds's interpreter and the target interpreter exist at this host's paths, and then the target
probe (target_side/mlstack_probe_target.py, the same script and parser as everywhere else) run by the
target interpreter from a here-document, with its `receipt` option: a read of the install receipt next to
it comes first. The Python parts travel as their modules' text in here-documents, not as paths: the node
may not have mlstack-ds at all.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from mlstack_ds.cluster.heartbeat import BEAT
from mlstack_ds.detect.marked import marked_object
from mlstack_ds.detect.target_probe import TargetFacts, parse_target_output
from mlstack_ds.installed.receipt import Receipt
from mlstack_ds.patience import WAITS
from mlstack_ds.target_side import mlstack_connect_check as connect_module
from mlstack_ds.target_side import mlstack_platform_tags as tags_module
from mlstack_ds.target_side import mlstack_probe_target as probe_module
from mlstack_ds.target_side import source

SECTION = "@@MLSTACK_NODE:"
RECEIPT_MARKER = probe_module.RECEIPT_MARKER
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# What a Slurm task sees that decides its devices and threads (`doctor --slurm`'s pitfalls).
TASK_VARIABLES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                  "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_NODEID", "SLURM_PROCID")
# How long a node's answer may take: patience.WAITS["node probe"], the local probe's stall rule, watched
# through the heartbeat the script writes while the probe works (`_ORPHAN_WATCH`).
# The end lines of the here-documents that carry target_side modules' text to a node's `python -`.
_HEREDOC_END = "MLSTACK_NODE_PROBE_END"
_CONNECT_END = "MLSTACK_NODE_CONNECT_END"
_TAGS_END = "MLSTACK_NODE_TAGS_END"


@dataclass(frozen=True)
class InterfaceAddress:
    interface: str
    address: str  # with its prefix length: 10.0.0.5/24
    scope: str  # `ip`'s scope: global, link, host

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return ipaddress.ip_interface(self.address).ip

    @property
    def loopback(self) -> bool:
        return self.interface == "lo" or self.ip.is_loopback


@dataclass(frozen=True)
class ReceiptSummary:
    """What the node's install receipt says, in brief (or why it could not be read)."""

    path: str
    deepspeed_version: str | None = None
    archs: tuple[str, ...] = ()
    problem: str | None = None

    def text(self) -> str:
        if self.problem:
            return f"unreadable ({self.problem})"
        return f"DeepSpeed {self.deepspeed_version} for {';'.join(self.archs) or 'no GPU arch'}"


@dataclass(frozen=True)
class NodeFacts:
    """One node as seen over ssh. `unreachable` set: nothing else is known. Unknowns are None/empty."""

    host: str
    unreachable: str | None = None
    hostname: str | None = None
    resolved: tuple[str, ...] = ()  # the addresses `hostname` resolves to on the node
    addresses: tuple[InterfaceAddress, ...] = ()
    ifname_env: Mapping[str, str] = field(default_factory=dict)
    rocm_version: str | None = None
    tool_present: bool | None = None
    python_present: bool | None = None
    target: TargetFacts | None = None
    receipt: ReceiptSummary | None = None
    task_env: Mapping[str, str] = field(default_factory=dict)  # TASK_VARIABLES set in its Slurm task
    rendezvous_resolved: tuple[str, ...] = ()  # what the rendezvous host's name resolves to there (Slurm)
    port_check: str | None = None  # "ok", or why the node could not connect to the rendezvous port (Slurm)
    bundle_seen: bool | None = None  # `doctor --offline DIR`: DIR/bundle.json is there at this path; None: not asked
    platform_tags: tuple[str, ...] = ()  # --offline: the wheel platform tags the node's pip takes, best first

    @property
    def gpu_archs(self) -> tuple[str, ...]:
        """The base targets of the node's visible devices (`gfx90a:sramecc+:xnack-` -> gfx90a)."""
        torch = self.target.torch if self.target else None
        if torch is None:
            return ()
        return tuple(sorted({(d.gcn_arch_name or "").split(":", 1)[0] for d in torch.devices} - {""}))

    def to_json(self) -> dict[str, Any]:
        target = self.target
        torch = target.torch if target else None
        return {
            "host": self.host,
            "reachable": self.unreachable is None,
            "unreachable": self.unreachable,
            "hostname": self.hostname,
            "hostname_resolves_to": list(self.resolved),
            "addresses": [{"interface": a.interface, "address": a.address, "scope": a.scope}
                          for a in self.addresses],
            "interface_variables": dict(self.ifname_env),
            "rocm_version": self.rocm_version,
            "mlstack_ds_interpreter": self.tool_present,
            "python_present": self.python_present,
            "python": None if target is None else {
                "executable": target.python.executable, "version": target.python.version,
                "answered": target.answered, "problem": target.problem, "torch_error": target.torch_error},
            "torch": None if torch is None else {
                "version": torch.version, "hip": torch.hip, "cuda": torch.cuda, "device_count": torch.device_count,
                "archs": list(self.gpu_archs)},
            "deepspeed": target.deepspeed.version if target and target.deepspeed else None,
            "receipt": None if self.receipt is None else {
                "path": self.receipt.path, "deepspeed_version": self.receipt.deepspeed_version,
                "archs": list(self.receipt.archs), "problem": self.receipt.problem},
            **({"bundle_seen": self.bundle_seen, "platform_tags": list(self.platform_tags)}
               if self.bundle_seen is not None else {}),
            **({"task_env": dict(self.task_env), "rendezvous_resolves_to": list(self.rendezvous_resolved),
                "rendezvous_port": self.port_check} if self.port_check is not None or self.task_env else {}),
        }


def node_script(python: Path, tool: Path, rendezvous: tuple[str, int] | None = None, bundle: Path | None = None
                ) -> str:
    """The `sh -s` script for one node: each part after its own section line, the probe last. With
    `rendezvous` (host, port; `doctor --slurm`, run as a Slurm task): also the task's device and thread
    variables, what the host resolves to there, and whether the target interpreter can connect to it. With
    `bundle` (`doctor --offline DIR`): whether DIR/bundle.json is there, and the node's wheel platform tags
    (packaging's, from mlstack-ds's own interpreter: the target's may not have packaging)."""
    py, tool_q = shlex.quote(str(python)), shlex.quote(str(tool))
    slurm = ""
    if rendezvous is not None:
        host, port = shlex.quote(rendezvous[0]), int(rendezvous[1])
        connect_s = WAITS["rendezvous connect"].ceiling_s
        slurm = (f"echo '{SECTION}task_env'\n"
                 + "".join(f'printf "%s=%s\\n" {v} "${{{v}-}}"\n' for v in TASK_VARIABLES)
                 + f"echo '{SECTION}rendezvous'; getent ahosts {host} 2>/dev/null\n"
                 f"echo '{SECTION}port'; if test -x {py}; then "
                 + _heredoc(f"{py} - {host} {port} {connect_s:g} 2>&1", connect_module, _CONNECT_END) + "fi\n")
    variables = "".join(f'printf "%s=%s\\n" {v} "${{{v}-}}"\n' for v in IFNAME_VARIABLES)
    return (
        f"echo '{SECTION}hostname'; hostname\n"
        f"echo '{SECTION}resolved'; getent ahosts \"$(hostname)\" 2>/dev/null\n"
        f"echo '{SECTION}addresses'; ip -o addr show 2>/dev/null\n"
        f"echo '{SECTION}env'\n{variables}"
        f"echo '{SECTION}rocm'; cat \"${{ROCM_PATH:-/opt/rocm}}/.info/version\" 2>/dev/null\n"
        f"echo '{SECTION}tool'; if test -x {tool_q}; then echo yes; else echo no; fi\n"
        f"{'' if bundle is None else _bundle_part(bundle, tool_q)}"
        f"{slurm}echo '{SECTION}python'\n"
        f"if test -x {py}; then echo yes; {_heredoc(f'{py} - receipt', probe_module, _HEREDOC_END, after=' &')}"
        f"{_ORPHAN_WATCH}"
        "else echo no; fi\n"
    )


def _bundle_part(bundle: Path, tool_q: str) -> str:
    manifest = shlex.quote(str(bundle / "bundle.json"))
    return (f"echo '{SECTION}bundle'; if test -f {manifest}; then echo seen; else echo unseen; fi\n"
            + _heredoc(f"{tool_q} - 2>/dev/null", tags_module, _TAGS_END))


def _heredoc(command: str, module: ModuleType, end: str, after: str = "") -> str:
    """`command <<'END'`, the module's text as its stdin: a `python -` inside the `sh -s` script reads its
    program from a here-document (the script itself is on stdin, and the node may not have the file)."""
    text = source(module)
    if end in text.splitlines():
        raise ValueError(f"{module.__name__} holds the here-document's end line {end}")
    return f"{command} <<'{end}'{after}\n{text}{'' if text.endswith(chr(10)) else chr(10)}{end}\n"


# ssh sends no hangup to a command without a terminal: when the tool is stopped (Ctrl-C) and its ssh goes,
# the node's shell is only re-parented, and a probe hanging in `import torch` would stay there for good.
# So the probe runs in the background and a watcher kills it once this shell's parent is no longer sshd.
# The watcher is also the probe's heartbeat (cluster/heartbeat.py's line, on stderr): once a second in which
# the probe used CPU or read from disk (its /proc stat's majflt, utime, stime, after the command name), so
# that the head stops a hung probe by the stall rule (WAITS["node probe"]) and lets a slow import go on.
_ORPHAN_WATCH = f"""probe=$!
( last=
  while kill -0 "$probe" 2>/dev/null; do
    now=$(ps -o ppid= -p $$ 2>/dev/null | tr -d ' ')  # empty without ps: then nothing is killed
    [ -z "$now" ] || [ "$now" = "$PPID" ] || {{ kill -9 "$probe" 2>/dev/null; exit; }}
    used=$(sed 's/.*) //' "/proc/$probe/stat" 2>/dev/null | cut -d' ' -f10,12,13)
    [ -z "$used" ] || [ "$used" = "$last" ] || {{ last=$used; echo '{BEAT}' >&2; }}
    sleep 1
  done ) >/dev/null &
watch=$!
wait "$probe"; status=$?
kill "$watch" 2>/dev/null
exit "$status"
"""


def parse_node_output(host: str, stdout: str, python: Path, *, interrupted: str | None = None) -> NodeFacts:
    """The script's sections as `NodeFacts`; a missing section leaves its facts unknown."""
    sections = _sections(stdout)
    present = sections.get("python", [])
    python_present = None if not present else present[0].strip() == "yes"
    target = None
    receipt = None
    if python_present:
        probe_output = "\n".join(present[1:])
        target = parse_target_output(probe_output, python, interrupted=interrupted)
        receipt = _receipt(probe_output)
    tool = sections.get("tool", [])
    bundle = sections.get("bundle", [])
    hostname = next((ln.strip() for ln in sections.get("hostname", []) if ln.strip()), None)
    rocm = next((ln.strip() for ln in sections.get("rocm", []) if ln.strip()), None)
    return NodeFacts(
        host=host, hostname=hostname, resolved=parse_getent(sections.get("resolved", [])),
        addresses=parse_ip_addr(sections.get("addresses", [])), ifname_env=_variables(sections.get("env", [])),
        rocm_version=rocm, tool_present=None if not tool else tool[0].strip() == "yes",
        python_present=python_present, target=target, receipt=receipt,
        task_env={k: v for k, v in (ln.split("=", 1) for ln in sections.get("task_env", []) if "=" in ln) if v},
        rendezvous_resolved=parse_getent(sections.get("rendezvous", [])),
        port_check=next((ln.strip() for ln in sections.get("port", []) if ln.strip()), None),
        bundle_seen={"seen": True, "unseen": False}.get(bundle[0].strip()) if bundle else None,
        platform_tags=tuple(bundle[1].split()) if len(bundle) > 1 else ())


def parse_getent(lines: list[str]) -> tuple[str, ...]:
    """`getent ahosts NAME` lines (`ADDRESS  STREAM NAME`, one per socket type) as distinct addresses."""
    seen: dict[str, None] = {}
    for line in lines:
        fields = line.split()
        if fields:
            try:
                seen[str(ipaddress.ip_address(fields[0]))] = None
            except ValueError:
                continue
    return tuple(seen)


def parse_ip_addr(lines: list[str]) -> tuple[InterfaceAddress, ...]:
    """`ip -o addr show` lines (`2: eth0    inet 10.0.0.5/24 brd ... scope global eth0\\ ...`)."""
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        try:
            ipaddress.ip_interface(fields[3])
        except ValueError:
            continue
        scope = fields[fields.index("scope") + 1] if "scope" in fields[:-1] else "global"
        found.append(InterfaceAddress(fields[1].split("@", 1)[0], fields[3], scope))
    return tuple(found)


def _sections(stdout: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(SECTION):
            current = sections.setdefault(line[len(SECTION):].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def _variables(lines: list[str]) -> dict[str, str]:
    pairs = (ln.split("=", 1) for ln in lines if "=" in ln)
    return {k: v for k, v in pairs if k in IFNAME_VARIABLES and v.strip()}


def _receipt(probe_output: str) -> ReceiptSummary | None:
    try:
        data = marked_object(probe_output, RECEIPT_MARKER)
        if data is None:
            return None
        path, text, error = str(data["path"]), data.get("text"), data.get("error")
    except (ValueError, KeyError, TypeError):
        return None
    if error:
        return ReceiptSummary(path, problem=str(error))
    if text is None:
        return None
    try:
        receipt = Receipt.from_dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        return ReceiptSummary(path, problem=str(exc))
    return ReceiptSummary(path, receipt.deepspeed_version, tuple(receipt.archs))

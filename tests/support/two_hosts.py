"""Two test "hosts" on one machine, for the multi-node tests and the multi-node benchmark.

Each host is a network namespace with its own UTS name (`hostname` prints the node's name, as on a real
cluster) and its own `sshd` (Debian's openssh-server), joined to the other by a veth pair. The names
resolve inside the namespaces through `/etc/netns/<ns>/hosts`, which `ip netns exec` binds over
`/etc/hosts` (only inside). The client side never touches `~/.ssh`: a throwaway key pair, an ssh config,
and a directory of `ssh`/`scp` wrappers (`ssh -F <config>`) put first on PATH, which DeepSpeed's launcher
(its own `ssh ... hostname` check) and pdsh (`PDSH_RCMD_TYPE=ssh`) both pick up. The
research note ../shared/research/two-hosts-on-one-machine.md measured each piece.

All namespaces share the file system, like an NFS home. `node_local` gives each host a mount namespace
in which a directory of its own is bound over a common path, so the same path holds different files on
each node (the copy-mode case).

Needs root, `ip`, `unshare`, `nsenter`, `/usr/sbin/sshd` and `pdsh` (scripts/test.sh installs them);
`missing()` says what is absent so that a test can skip with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cli import CliResult, run_cli, start_cli

SSHD = Path("/usr/sbin/sshd")
SSH = Path("/usr/bin/ssh")
SCP = Path("/usr/bin/scp")
SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")  # scp of OpenSSH >= 9 speaks SFTP
NETNS_ETC = Path("/etc/netns")
SUBNET = "10.213.77"
NODE_NAMES = ("mls-node-a", "mls-node-b")
REPO_ROOT = Path(__file__).resolve().parents[2]
INTERFACE = "mls0"  # the same name on every node, so that one GLOO_SOCKET_IFNAME fits all


def missing() -> str | None:
    """Why the harness cannot run here, or None."""
    if os.geteuid() != 0:
        return "the two-host harness needs root (network namespaces)"
    for tool in ("ip", "unshare", "nsenter", "pdsh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/test.sh installs it)"
    if not SSHD.exists():
        return "openssh-server is not installed (scripts/test.sh installs it)"
    return None


@dataclass
class Host:
    name: str
    address: str
    netns: str
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.sshd is not None
        return self.sshd.pid


@dataclass
class TwoHosts:
    root: Path
    hosts: list[Host]
    ssh_config: Path
    bin_dir: Path
    node_local: Mapping[str, Mapping[Path, Path]] = field(default_factory=dict)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) with the ssh wrappers first on PATH and pdsh set to ssh."""
        base = dict(os.environ if base is None else base)
        return {**base, "PATH": f"{self.bin_dir}{os.pathsep}{base.get('PATH', '')}", "PDSH_RCMD_TYPE": "ssh"}

    def hostfile(self, slots: int = 1, directory: Path | None = None) -> Path:
        path = (directory or self.root) / f"hostfile-{slots}"
        path.write_text("".join(f"{h.name} slots={slots}\n" for h in self.hosts))
        return path

    def on(self, host: Host, argv: Sequence[str | Path]) -> list[str]:
        """argv run on `host`: in its network, mount and UTS namespaces (as if logged in there)."""
        return ["nsenter", "--target", str(host.pid), "--net", "--mount", "--uts", "--", *map(str, argv)]

    def run_on(self, host: Host, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None,
               timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.on(host, argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env), cwd=cwd)

    def ssh(self, host: Host, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`command` on `host` over ssh, from the first host (how the tool reaches a node)."""
        return self.run_on(self.hosts[0], [self.bin_dir / "ssh", host.name, command], timeout=timeout)

    def processes(self, host: Host) -> list[int]:
        """PIDs in `host`'s network namespace other than its sshd (to prove nothing was left running)."""
        listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
        return [int(p) for p in listed.stdout.split() if int(p) != host.pid]


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _run(*argv: str | Path) -> None:
    proc = subprocess.run(list(map(str, argv)), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({proc.returncode}): {proc.stderr.strip()}")


def _wait_listening(host: Host, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert host.sshd is not None
        if host.sshd.poll() is not None:
            raise RuntimeError(f"sshd of {host.name} exited with {host.sshd.returncode}")
        probe = subprocess.run(["ip", "netns", "exec", host.netns, "python3", "-c",
                                f"import socket; socket.create_connection(('{host.address}', 22), 1)"],
                               capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"sshd of {host.name} did not listen within {timeout:g} s")


@contextlib.contextmanager
def two_hosts(root: Path, *, node_local: Mapping[str, Mapping[Path, Path]] | None = None,
              names: Sequence[str] = NODE_NAMES, own_hostnames: bool = True
              ) -> Iterator[TwoHosts]:
    """Start the two hosts; on exit kill everything that runs in them and remove every trace.

    `node_local` maps a host name to {common path: that node's own directory}, bound over the common
    path in the node's mount namespace (the common path must exist; it is what the other side sees).
    `own_hostnames=False` leaves both nodes with this machine's hostname, which resolves to an address
    neither node has (the misconfigured-cluster case that makes gloo fall back to loopback).
    """
    why = missing()
    if why:
        raise RuntimeError(why)
    root.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    hosts = [Host(name, f"{SUBNET}.{i + 1}", f"mls-{tag}-{i}") for i, name in enumerate(names)]
    key = root / "id_ed25519"
    for old in (key, root / "id_ed25519.pub", root / "host_key", root / "host_key.pub"):  # a reused root
        old.unlink(missing_ok=True)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "host_key")
    authorized = _write(root / "authorized_keys", (root / "id_ed25519.pub").read_text(), 0o600)
    ssh_config = _write(root / "ssh_config", "".join(
        f"Host {h.name}\n  HostName {h.address}\n" for h in hosts) + (
        f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 5\n"))
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in (SSH, SCP):
        _write(bin_dir / tool.name, f'#!/bin/sh\nexec {tool} -F {ssh_config} "$@"\n', 0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    made_netns: list[str] = []
    # Their names, kept after they are gone: which test made a namespace, and whether it removed its own
    # (other suites on this machine make theirs at the same time).
    _write(root / "netns", "".join(f"{h.netns}\n" for h in hosts))
    try:
        for host in hosts:
            _run("ip", "netns", "add", host.netns)
            made_netns.append(host.netns)
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in hosts))
        a, b = hosts
        _run("ip", "link", "add", INTERFACE, "netns", a.netns, "type", "veth", "peer", "name", INTERFACE,
             "netns", b.netns)
        for host in hosts:
            for argv in (["addr", "add", f"{host.address}/24", "dev", INTERFACE], ["link", "set", INTERFACE, "up"],
                         ["link", "set", "lo", "up"]):
                _run("ip", "-n", host.netns, *argv)
            config = _write(root / f"sshd_config-{host.name}", (
                f"ListenAddress {host.address}\nHostKey {root / 'host_key'}\nPidFile {root / host.name}.pid\n"
                f"AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\nStrictModes no\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nMaxStartups 100\n"
                f"Subsystem sftp {SFTP_SERVER}\n"))
            mounts = "".join(f"mount --bind '{own}' '{common}' && "
                             for common, own in (node_local or {}).get(host.name, {}).items())
            rename = f"hostname {host.name} && " if own_hostnames else ""
            script = f"{rename}{mounts}exec {SSHD} -D -e -f {config}"
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", script],
                stdout=subprocess.DEVNULL, stderr=(root / f"sshd-{host.name}.log").open("wb"),
                start_new_session=True)
        for host in hosts:
            _wait_listening(host)
        yield TwoHosts(root, hosts, ssh_config, bin_dir, node_local or {})
    finally:
        for name in made_netns:
            listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in listed.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for host in hosts:
            if host.sshd is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.sshd.wait(timeout=10)
        for name in made_netns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def free_port_on(harness: TwoHosts, host: Host) -> int:
    """A port nobody listens on in `host`'s namespace."""
    out = harness.run_on(host, ["python3", "-c", "import socket; s=socket.socket(); s.bind(('',0)); "
                                "print(s.getsockname()[1])"])
    return int(out.stdout.strip())


def scratch_dir(hosts: TwoHosts) -> Path:
    """The common path of the node-local scratch directories (tests/multinode/conftest.py: node_local_hosts)."""
    return next(common for common in hosts.node_local[NODE_NAMES[0]] if common.name == "scratch")


def host_cli(hosts: TwoHosts, host: Host, *args: str | Path, timeout: float = 900,
             env: Mapping[str, str] | None = None, cwd: Path | None = REPO_ROOT) -> CliResult:
    """`mlstack-ds ARGS` run on `host` (its network, mounts and name), the tool from this checkout."""
    return run_cli(*args, prefix=hosts.on(host, []), timeout=timeout, cwd=cwd,
                   base_env=hosts.env({**os.environ, **(env or {}), "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}))


def node_status(hosts: TwoHosts, host: Host, python: Path) -> dict[str, Any]:
    """`status --json` run on `host` itself (its mounts: its own copy of a node-local venv)."""
    result = host_cli(hosts, host, "status", "--python", python, "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def start_head_cli(hosts: TwoHosts, *args: str | Path) -> subprocess.Popen[str]:
    """`mlstack-ds ARGS` started on the first host and returned running (`start_cli`), for a test that signals
    it: nsenter execs the CLI itself, so a signal sent to the Popen reaches the CLI."""
    return start_cli(*args, prefix=hosts.on(hosts.hosts[0], []), cwd=REPO_ROOT,
                     base_env=hosts.env({**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}))


def wait_nothing_left(hosts: TwoHosts, timeout: float = 120) -> dict[str, list[str]]:
    """{host name: "pid command line"} of what still runs in each host (its sshd aside) once that is nothing,
    or after `timeout` s: the proof that a stopped run left nothing running on any node."""
    deadline = time.monotonic() + timeout
    while True:
        left = {host.name: [f"{pid} {command_line(pid)}" for pid in hosts.processes(host)] for host in hosts.hosts}
        left = {name: procs for name, procs in left.items() if procs}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def command_line(pid: int) -> str:
    """A process's command line, for an assertion's message ("(gone)" once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


def head_cli(hosts: TwoHosts, *args: str | Path, timeout: float = 900,
             env: dict[str, str] | None = None) -> CliResult:
    """`mlstack-ds ARGS` run on the first host, where a user logged in to the cluster would run it."""
    return host_cli(hosts, hosts.hosts[0], *args, timeout=timeout, env=env)

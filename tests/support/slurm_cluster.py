"""A real two-node Slurm cluster on the two test hosts of tests/support/two_hosts.py, for `--slurm` tests.

The nodes are the two network namespaces of `two_hosts` (their names, addresses, UTS names and
/etc/netns/<ns>/hosts); this module adds one `munged` on the host (its socket in the harness directory,
reachable from both namespaces because they share the file system), `slurmctld` on the first node and
`slurmd` on both, each entered into its node's namespaces (`TwoHosts.on`) so that it has the node's hostname:
slurmctld refuses to start unless the host's name is `SlurmctldHost`, and job steps inherit the name.
Everything Slurm writes (conf, state, spool, logs, pid files) is under the harness directory. Slurm
commands run inside a node (`run_in`), as a user on a login node would: the host has no route to the nodes.
The research note ../shared/research/slurm-on-one-machine.md measured each piece.

Needs what `two_hosts` needs plus Debian's slurmctld, slurmd, slurm-client and munge (scripts/test.sh
installs them); `missing()` says what is absent so that a test can skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import two_hosts as th
from .two_hosts import Host, TwoHosts

SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "salloc", "sinfo", "scontrol", "scancel", "squeue")
SLURM_BIN = "/usr/bin"  # Debian's slurm-client
SOCKET_PATH_MAX = 107  # sun_path's bytes; slurmd's step sockets are <spool dir>/<node>_<job>.<step>
READY_TIMEOUT = 180.0  # from the first daemon to both nodes idle: seconds idle, tens under a load of 15+


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing() -> str | None:
    """Why the Slurm harness cannot run here (the two-host harness's reason first), or None."""
    why = th.missing()
    if why:
        return why
    absent = [name for name in (*DAEMONS, *CLIENTS) if _tool(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge)"
    return None


@dataclass
class SlurmCluster:
    """A started cluster: `nodes` are the two hosts (name, address), the first runs slurmctld."""

    root: Path
    hosts: TwoHosts
    conf: Path
    kill_wait: int
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Host]:
        return self.hosts.hosts

    @property
    def login(self) -> Host:
        """Where users run Slurm commands: the first node (also the controller, as on a small cluster)."""
        return self.nodes[0]

    def node(self, name: str) -> Host:
        return next(host for host in self.nodes if host.name == name)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) with SLURM_CONF and the Slurm commands on PATH (and the ssh wrappers)."""
        env = self.hosts.env(base)
        return {**env, "SLURM_CONF": str(self.conf), "PATH": f"{env['PATH']}{os.pathsep}{SLURM_BIN}"}

    def run_in(self, node: Host, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None,
               timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """argv inside `node` (network, mounts, hostname) with the cluster's env and no stdin, like a batch user."""
        return subprocess.run(self.hosts.on(node, argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env), cwd=cwd, stdin=subprocess.DEVNULL)

    def popen_in(self, node: Host, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> subprocess.Popen[str]:
        """argv started inside `node` in a session of its own (to signal it, or its group, later)."""
        return subprocess.Popen(self.hosts.on(node, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, env=self.env(env), cwd=cwd,
                                start_new_session=True)

    def salloc(self, argv: Sequence[str | Path], *, nodes: int = 2, options: Sequence[str] = (),
               env: Mapping[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`salloc -N<nodes> OPTIONS -- ARGV` on the login node: ARGV runs there (not on the allocation's
        nodes) with the allocation's SLURM_* env, so it reaches the nodes with `srun`. salloc's exit status is
        ARGV's, ARGV's output is salloc's stdout, and salloc's own messages are kept out of stderr (--quiet)."""
        return self.run_in(self.login, ["salloc", f"-N{nodes}", "--quiet", *options, "--", *argv], env=env,
                           timeout=timeout)

    def allocate(self, *, nodes: int = 2, options: Sequence[str] = (), timeout: float = 300) -> str:
        """The id of a new allocation with no command in it (`salloc --no-shell`), for `srun --jobid=ID`
        started from any node and for `scancel ID`; it lasts until cancelled."""
        out = self.run_in(self.login, ["salloc", f"-N{nodes}", "--no-shell", *options], timeout=timeout)
        granted = re.search(r"Granted job allocation (\d+)", out.stderr)
        if out.returncode != 0 or granted is None:
            raise RuntimeError(f"salloc --no-shell failed ({out.returncode}): {out.stderr.strip()}")
        return granted.group(1)

    def squeue(self) -> list[str]:
        """The job ids Slurm still knows (running, pending or completing)."""
        out = self.run_in(self.login, ["squeue", "-h", "-o", "%i"], timeout=60)
        return out.stdout.split()

    def wait_squeue_empty(self, timeout: float = 120) -> list[str]:
        """`squeue()` once it is empty, or what is still there after `timeout` seconds: a job whose last process
        is gone stays in squeue as completing (CG) until slurmctld hears from every node, a moment after its
        salloc or CLI ended (measured on a busy CI machine: still listed right after the CLI's exit)."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.squeue()
            if not jobs or time.monotonic() > deadline:
                return jobs
            time.sleep(0.5)

    def processes(self, node: Host) -> list[int]:
        """PIDs in `node`'s network namespace other than its sshd and Slurm daemons (slurmctld's own child
        slurmscriptd included): a job's processes, slurmstepd included (to prove nothing of a job is left)."""
        daemons = {proc.pid for proc in self.daemons.values()}
        return [pid for pid in self.hosts.processes(node) if pid not in daemons and _ppid(pid) not in daemons]

    def leftovers(self) -> dict[str, list[str]]:
        """{node name: "pid command line"} of every process `processes` finds, for an assertion's message."""
        return {node.name: [f"{pid} {th.command_line(pid)}" for pid in self.processes(node)] for node in self.nodes}

    def wait_no_leftovers(self, timeout: float = 120) -> dict[str, list[str]]:
        """`leftovers()` once it is empty, or what is still there after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = {name: procs for name, procs in self.leftovers().items() if procs}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def node_states(self) -> dict[str, str]:
        """{node name: state} as `sinfo` prints it (idle, alloc, mix, down*, unknown...)."""
        out = self.run_in(self.login, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=60)
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())

    def wait_idle(self, timeout: float = READY_TIMEOUT) -> None:
        """Until both nodes are idle (a job's cleanup done), else RuntimeError with the daemons' log tails."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.log_tails()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                states = self.node_states()
            if len(states) == len(self.nodes) and all(state == "idle" for state in states.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes are not idle after {timeout:g} s (sinfo: {states})\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each daemon's log (its stderr when it died before opening the log)."""
        tails = []
        for name in sorted({log.name.split(".")[0] for log in (self.root / "log").iterdir()}):
            log = self.root / "log" / f"{name}.log"
            if not log.exists() or not log.stat().st_size:
                log = log.with_suffix(".stderr")
            text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else ["(nothing)"]
            tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _slurm_conf(root: Path, nodes: Sequence[Host], munge_socket: Path, kill_wait: int) -> str:
    controller = nodes[0]
    cpus = os.cpu_count() or 1  # more than the machine has, and slurmd's node is drained ("Low CPU count")
    return "".join([
        "ClusterName=mls\n",
        f"SlurmctldHost={controller.name}({controller.address})\n",
        "SlurmctldPort=6817\nSlurmdPort=6818\n",  # each node has its own network stack: no clash across harnesses
        f"AuthType=auth/munge\nAuthInfo=socket={munge_socket}\nCredType=cred/munge\n",
        "SlurmUser=root\nSlurmdUser=root\n",
        f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool/%n\n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid\nSlurmdPidFile={root}/run/slurmd-%n.pid\n",
        f"SlurmctldLogFile={root}/log/slurmctld.log\nSlurmdLogFile={root}/log/slurmd-%n.log\n",
        "SlurmctldDebug=info\nSlurmdDebug=info\n",
        # no cgroups: this machine's v1 hierarchy defeats slurmd's autodetection (cgroup.conf pins v1, unused)
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n",
        "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n",
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerType=sched/backfill\n",
        "MpiDefault=none\nMailProg=/bin/true\nReturnToService=2\n",
        # KillWait: seconds between a cancel's SIGTERM and SIGKILL. The time-outs tolerate a load of 15+.
        f"KillWait={kill_wait}\nMessageTimeout=60\nTCPTimeout=20\nSlurmdTimeout=600\nInactiveLimit=0\n",
        *(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN\n" for n in nodes),
        f"PartitionName=mls Nodes={','.join(n.name for n in nodes)} Default=YES MaxTime=INFINITE State=UP\n",
    ])


CGROUP_CONF = ("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
               "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainSwapSpace=no\nConstrainDevices=no\n")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not create {path} within {timeout:g} s")
        time.sleep(0.2)


def _kill_all(cluster: SlurmCluster, timeout: float = 60) -> None:
    """SIGKILL the daemons, then every job process on the nodes until none is left (steps fork while dying)."""
    for proc in cluster.daemons.values():
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for node in cluster.nodes for pid in cluster.processes(node)]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for proc in cluster.daemons.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


@contextlib.contextmanager
def slurm_cluster(root: Path, *, hosts: TwoHosts | None = None, kill_wait: int = 5,
                  ready_timeout: float = READY_TIMEOUT) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and both slurmds and wait until both nodes are idle; on exit kill every daemon
    and job process. Without `hosts`, the two hosts are started here (and removed on exit, namespaces and
    /etc/netns entries included); with them, they stay up for their owner. A reused `root` starts from clean
    state (`-c`, and the state, spool and log directories are emptied)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if hosts is None:
            hosts = stack.enter_context(th.two_hosts(root / "hosts"))
        slurm = root / "slurm"
        for sub in ("state", "spool", "log", "run", "munge"):
            shutil.rmtree(slurm / sub, ignore_errors=True)
            (slurm / sub).mkdir(parents=True)
        for host in hosts.hosts:
            (slurm / "spool" / host.name).mkdir()  # slurmd does not create its %n spool directory
            if len(str(slurm / "spool" / host.name / host.name)) + len("_123456.1234") > SOCKET_PATH_MAX:
                raise RuntimeError(f"{slurm} is too long a path for slurmd's step sockets: give a shorter root")
        key = slurm / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        socket = slurm / "munge" / "sock"
        conf = slurm / "slurm.conf"
        conf.write_text(_slurm_conf(slurm, hosts.hosts, socket, kill_wait))
        (slurm / "cgroup.conf").write_text(CGROUP_CONF)
        cluster = SlurmCluster(slurm, hosts, conf, kill_wait)
        stack.callback(_kill_all, cluster)
        log = slurm / "log"
        daemon_env = cluster.env()
        cluster.daemons["munged"] = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket}",
             f"--pid-file={slurm / 'run' / 'munged.pid'}", f"--log-file={log / 'munged.log'}",
             f"--seed-file={slurm / 'munge' / 'seed'}"],
            stdout=subprocess.DEVNULL, stderr=(log / "munged.stderr").open("wb"), start_new_session=True)
        _wait_for(socket, cluster.daemons["munged"], "munged", ready_timeout)
        starts = [("slurmctld", hosts.hosts[0], ["slurmctld", "-D", "-c", "-f", conf])]
        starts += [(f"slurmd-{h.name}", h, ["slurmd", "-D", "-c", "-f", conf, "-N", h.name]) for h in hosts.hosts]
        for name, host, argv in starts:
            cluster.daemons[name] = subprocess.Popen(
                hosts.on(host, argv), stdout=subprocess.DEVNULL, stderr=(log / f"{name}.stderr").open("wb"),
                stdin=subprocess.DEVNULL, env=daemon_env, start_new_session=True)
        cluster.wait_idle(ready_timeout)
        yield cluster

"""Faults made to one test node while a launch runs on it: its link taken down, its CPU throttled.

Both are real: the link is the node's veth end (`ip -n <netns> link set mls0 down`: packets vanish, no
reset reaches either side, as when a node's cable or switch port dies), and the throttle is a cgroup v1
`cpu` quota on the node's daemon (sshd or slurmd), which every process it starts afterwards inherits. Each
is a context manager that puts the node back as it was however the block ends, so a failing test leaves
no node down and no cgroup behind. `ranks_started` waits for the observable event a fault is timed on;
`lose_node_mid_check` is the whole lost-node sequence around a running CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import ExitCode

from .cli import CliResult, assert_one_error
from .two_hosts import INTERFACE, Host, TwoHosts

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # this machine's cgroup v1 `cpu` controller


def cpu_cgroup_missing() -> str | None:
    """Why a CPU quota cannot be set here, or None."""
    if not (CPU_CGROUP / "cpu.cfs_quota_us").is_file():
        return f"no cgroup v1 cpu controller at {CPU_CGROUP}"
    if not os.access(CPU_CGROUP, os.W_OK):
        return f"{CPU_CGROUP} is not writable (needs root)"
    return None


def _set_link(host: Host, state: str) -> None:
    subprocess.run(["ip", "-n", host.netns, "link", "set", INTERFACE, state], check=True, capture_output=True)


@contextlib.contextmanager
def link_down(host: Host) -> Iterator[None]:
    """`host`'s link to the other node down for the block, up again afterwards."""
    _set_link(host, "down")
    try:
        yield
    finally:
        _set_link(host, "up")


@contextlib.contextmanager
def cpu_throttled(pid: int, fraction: float) -> Iterator[Path]:
    """Process `pid` (a node's sshd or slurmd) in a child cgroup of its own whose CPU quota is `fraction` of
    one CPU (cpu.cfs_quota_us = cpu.cfs_period_us * fraction): everything it starts in the block runs there.
    Afterwards every process still in the cgroup goes back to the root cgroup and the cgroup is removed."""
    group = CPU_CGROUP / f"mlstack-test-slow-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(f"{int(period * fraction)}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")
        yield group
    finally:
        deadline = time.monotonic() + 30
        while True:
            for member in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # it may have exited meanwhile
                    (CPU_CGROUP / "cgroup.procs").write_text(f"{member}\n")
            try:
                group.rmdir()
                break
            except OSError:  # a process forked while being moved: move again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


# Rank 1 sleeps (SLOW_FAULT_S, 60 s) once it has begun the check, before its first collective: the window in
# which a test takes its node away while the check runs. Without it zero1 takes about a second on a quiet
# machine and ended before the link went down (a run of the Slurm lost-node test, 2026-11-29).
HOLD_RANK1_IN = "slow:rank1:{check}"


def ranks_started(root: Path, check: str, world_size: int, timeout: float) -> Path:
    """The results directory under `root` (the CLI's TMPDIR) once every rank has begun `check` (its
    `{"event": "start", "check": ...}` line), i.e. while the ranks train; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for results in root.glob("mlstack-verify-*/results"):
            if all(_began(results / f"rank{rank}.jsonl", check) for rank in range(world_size)):
                return results
        time.sleep(0.5)
    raise AssertionError(f"the ranks did not all begin {check} within {timeout:g} s")


def _began(rank_file: Path, check: str) -> bool:
    try:
        lines = rank_file.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "start" and record.get("check") == check:
                return True
    return False


@dataclass(frozen=True)
class LostNodeRun:
    stdout: str
    stderr: str
    returncode: int
    took_s: float  # from the link going down to the CLI's end
    left: list[int]  # `survivors()` when the CLI ended, the link still down


def lose_node_mid_check(cli: subprocess.Popen[str], lost: Host, tmpdir: Path, check: str, *, timeout: float,
                        survivors: Callable[[], list[int]]) -> LostNodeRun:
    """Once both ranks began `check` (their files under the CLI's TMPDIR `tmpdir`), `lost`'s link goes down
    until `cli` ends (at most `timeout` s); the link is up again and the CLI killed however this ends."""
    try:
        results = ranks_started(tmpdir, check, 2, timeout=600)
        with link_down(lost):
            lost_at = time.monotonic()
            assert not (results / "summary.json").exists(), f"{check} ended before the link went down"
            out, err = cli.communicate(timeout=timeout)
            return LostNodeRun(out, err, cli.returncode, time.monotonic() - lost_at, survivors())
    finally:
        if cli.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # its own session (Slurm's salloc), or just itself
                os.killpg(cli.pid, signal.SIGKILL) if os.getpgid(cli.pid) == cli.pid else cli.kill()
            cli.communicate()


def fill_node_package_dir(hosts: TwoHosts, node: Host, venv: Path, own_venv: Path) -> None:
    """`node`'s DeepSpeed package directory of `venv` (its own copy `own_venv`, node_local_hosts) becomes a
    256 KiB file system of its own there, so that pip fills it while installing DeepSpeed: a full disk on that
    node only."""
    (package,) = venv.glob("lib/python3*/site-packages")
    (own_venv / package.relative_to(venv) / "deepspeed").mkdir()
    mounted = hosts.run_on(node, ["mount", "-t", "tmpfs", "-o", "size=256k", "mls-full", package / "deepspeed"])
    assert mounted.returncode == 0, mounted.stderr


def assert_disk_full_named(result: CliResult, node: str, rolled_back: str) -> None:
    """The install's one-line error names `node`'s full disk and the rollback of `rolled_back`."""
    assert result.returncode == ExitCode.INSTALL, result.stderr[-3000:]
    error_line, _hint = result.one_error()
    assert error_line.startswith(f"error: node {node}: install failed: "), error_line
    assert "No space left on device" in error_line, error_line
    assert error_line.endswith(f"; rolled back on {rolled_back}"), error_line
    assert [(n["host"], n["action"]) for n in result.json["error"]["nodes"]] == [
        (rolled_back, "rolled-back"), (node, "failed")]


def assert_install_interrupted(code: int, said: str) -> None:
    """An install over two nodes stopped (Ctrl-C/SIGTERM) after node a was done: exit 130, one error naming
    node a's rollback and no failure, and the hint that nothing is left running."""
    assert code == ExitCode.INTERRUPTED, said[-3000:]
    error, hint = assert_one_error(said)
    assert error.startswith("error: interrupted: the install over 2 node(s) was stopped; rolled back on "), error
    assert "mls-node-a" in error and "failed" not in error, error
    assert hint == "hint: nothing of the run is left running; run the same command again to install", hint

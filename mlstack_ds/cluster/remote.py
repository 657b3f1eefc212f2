"""Reach the nodes of a hostfile the way DeepSpeed's pdsh launcher does: plain `ssh` and `scp` from PATH.

Why the ssh on PATH with the user's own configuration, and no options of ours beyond BatchMode and a
connect time-out: DeepSpeed's launcher checks each host with its own `ssh <host> hostname` and pdsh runs
`ssh` the same way, so whatever makes those work (`~/.ssh/config`, an agent, a wrapper first on PATH)
makes this work too, and a node this module cannot reach is one the launch could not reach either.
BatchMode makes a missing key an error instead of a password prompt that would hang a non-interactive run.
ServerAlive makes a node that goes away mid-command (its link down, powered off) an ssh failure within
about a minute (SERVER_ALIVE_S), instead of a connection that waits out the command's whole time-out (an
hour for a node's install): the run then names the node and rolls the others back.
Remote commands are argv lists joined with `shlex.join` (ssh hands the remote shell one string).
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.errors import EnvironmentProblem, ToolError, ToolMissing, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience

SERVER_ALIVE_S = (15, 4)  # a keepalive every 15 s; 4 unanswered ones: the node is gone
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", f"ServerAliveInterval={SERVER_ALIVE_S[0]}",
               "-o", f"ServerAliveCountMax={SERVER_ALIVE_S[1]}")
# ssh sessions at once when every node is asked the same (sshd's default MaxStartups 10:30:100 limits
# unauthenticated connections per target node, not the fan-out; the head's key exchanges are the limit)
MAX_PARALLEL_NODES = 32
SSH_FAILED = 255  # ssh's own exit code for "could not run the command there" (the command's otherwise)
REACH_HINT = ("DeepSpeed's launcher needs passwordless ssh from this host to every node: "
              "`ssh -o BatchMode=yes {host} hostname` must print the node's name")


@dataclass(frozen=True)
class NodeUnreachable:
    """Why ssh could not run a command on a node, in ssh's own words (its last stderr line)."""

    host: str
    reason: str

    def error(self) -> EnvironmentProblem:
        return EnvironmentProblem(f"node {self.host} is not reachable over ssh: {self.reason}",
                                  hint=REACH_HINT.format(host=self.host))


def ssh_argv(host: str, command: Sequence[str | Path]) -> list[str]:
    return ["ssh", *SSH_OPTIONS, host, "--", shlex.join(map(str, command))]


def run_on(host: str, command: Sequence[str | Path], *, patience: Patience = WAITS["ssh command"],
           env: Mapping[str, str] | None = None, input_text: str | None = None) -> runner.RunResult:
    """`command` on `host` (exit code and output of the remote command; 255 when ssh itself failed)."""
    try:
        return runner.run(ssh_argv(host, command), patience=patience, env=env, input_text=input_text)
    except ToolMissing as exc:
        raise EnvironmentProblem("ssh is not installed on this host",
                                 hint="install the OpenSSH client (Debian: apt-get install openssh-client)") from exc


def start_on(host: str, command: Sequence[str | Path], *, patience: Patience = WAITS["ssh command"],
             env: Mapping[str, str] | None = None, input_text: str | None = None, stall_on_stderr: bool = False
             ) -> AbstractContextManager[runner.Background]:
    """`command` on `host` in the background, for a caller that wants what it printed before a time-out
    (`Background.partial_stdout`): a remote probe that prints in stages keeps the stages it finished.
    `stall_on_stderr`: see `runner.run` (ssh is idle while the node works; the node's stderr is not)."""
    return runner.run_in_background(ssh_argv(host, command), patience=patience, env=env, input_text=input_text,
                                    stall_on_stderr=stall_on_stderr)


def unreachable(result: runner.RunResult, host: str) -> NodeUnreachable | None:
    """The ssh failure in `result`, if ssh (not the remote command) failed."""
    if result.returncode != SSH_FAILED:
        return None
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    reason = lines[-1] if lines else "ssh exited with 255 and said nothing"
    return NodeUnreachable(host, re.sub(r"^ssh: ", "", reason))


def check_reachable(host: str, *, patience: Patience = WAITS["reachable check"],
                    env: Mapping[str, str] | None = None) -> NodeUnreachable | None:
    """None when `ssh host hostname` works, else why not (refused, no route, no key, time-out)."""
    try:
        result = run_on(host, ["hostname"], patience=patience, env=env)
    except ToolTimedOut:
        return NodeUnreachable(host, f"no answer within {patience.ceiling_s:g} s")
    return unreachable(result, host) if not result.ok else None


def copy_to(host: str, local: Path, remote_parent: Path, *, patience: Patience = WAITS["copy to node"],
            env: Mapping[str, str] | None = None) -> None:
    """Copy the file or directory `local` into `remote_parent` on `host` (created if missing)."""
    _checked(run_on(host, ["mkdir", "-p", remote_parent], env=env), host, f"creating {remote_parent}")
    _checked(_scp(["-r", "-q", str(local), f"{host}:{remote_parent}/"], patience, env), host,
             f"copying {local.name} to {remote_parent}")


def fetch_from(host: str, remote_paths: Sequence[Path], local_dir: Path, *,
               patience: Patience = WAITS["copy from node"],
               env: Mapping[str, str] | None = None) -> runner.RunResult:
    """Copy `remote_paths` (globs allowed) from `host` into `local_dir`; the caller reads the result
    (a node that wrote nothing is not an error here)."""
    return _scp(["-q", *(f"{host}:{p}" for p in remote_paths), str(local_dir)], patience, env)


def stop_marked(host: str, marker: str, *, grace: Patience = WAITS["stop grace"],
                env: Mapping[str, str] | None = None) -> None:
    """SIGTERM every process on `host` whose command line contains `marker`, up to `grace` for them to end,
    then SIGKILL what is left (best effort: the node may be gone). SIGTERM first, because this tool stops
    cleanly on it (a package swap in progress is finished, its pip never left running); SIGKILL would leave
    that pip running on its own. `[x]rest` is a regular expression that matches `marker` but not this script's
    own command line."""
    pattern = f"[{marker[0]}]{re.escape(marker[1:])}"
    script = ('pkill -TERM -f "$1" || exit 0; i=0; while pgrep -f "$1" >/dev/null; do i=$((i+1)); '
              'if [ "$i" -gt "$2" ]; then pkill -KILL -f "$1"; exit 0; fi; sleep 1; done')
    grace_s = int(grace.ceiling_s)
    around = Patience(ceiling_s=grace_s + WAITS["ssh command"].ceiling_s)  # the grace, and ssh's own time around it
    try:
        run_on(host, ["sh", "-c", script, "sh", pattern, str(grace_s)], patience=around, env=env)
    except ToolError:
        return


def _scp(args: Sequence[str], patience: Patience, env: Mapping[str, str] | None) -> runner.RunResult:
    try:
        return runner.run(["scp", *SSH_OPTIONS, *args], patience=patience, env=env)
    except ToolMissing as exc:
        raise EnvironmentProblem("scp is not installed on this host",
                                 hint="install the OpenSSH client (Debian: apt-get install openssh-client)") from exc


def _checked(result: runner.RunResult, host: str, doing: str) -> None:
    if result.ok:
        return
    gone = unreachable(result, host)
    if gone is not None:
        raise gone.error()
    raise EnvironmentProblem(f"node {host}: {doing} failed: {result.tail(1) or f'exit code {result.returncode}'}",
                             hint="the user running mlstack-ds must be able to write there on every node")


@dataclass(frozen=True)
class SharedFileProbe:
    """The one shared-file-system probe: a file with a random name that this host writes; a node that sees
    it at the same path (`NodeTransport.sees`) shares that file system.

    Why not compare paths or mount tables: an NFS home, a cluster file system and a bind mount all look
    different there; finding what was just written is the one answer that is always right."""

    path: Path
    content: str

    @classmethod
    def here(cls, directory: Path, prefix: str) -> SharedFileProbe:
        """Write a probe into `directory` on this host (created if missing)."""
        content = secrets.token_hex(16)
        probe = cls(directory / f"{prefix}{content[:12]}", content)
        directory.mkdir(parents=True, exist_ok=True)
        probe.path.write_text(probe.content)
        return probe

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

"""`--hostfile`: the seam (cluster/transport.py) over ssh and scp, the way DeepSpeed's pdsh launcher reaches
the nodes (cluster/remote.py says why plain ssh from PATH)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster import remote
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.heartbeat import without_beats
from mlstack_ds.cluster.hostfile import HostEntry, parse_hostfile
from mlstack_ds.cluster.tool import ToolRun, check_tool, run_tool
from mlstack_ds.cluster.transport import ScriptAnswer
from mlstack_ds.errors import EnvironmentProblem, ToolMissing, ToolStalled, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience


@dataclass(frozen=True)
class SshNodes:
    """The nodes of a hostfile (those with slots), reached over ssh; files copied with scp."""

    entries: tuple[HostEntry, ...]
    env: Mapping[str, str] | None = None  # the environment ssh runs in (None: this process's)
    option: str = "--hostfile"
    reached_by: str = "ssh"
    no_answer: str = "not reachable over ssh"
    copies_files: bool = True

    @classmethod
    def read(cls, hostfile: Path, *, command: str) -> SshNodes:
        """The hostfile's nodes, once ssh and scp are known to exist here (one clear error before any node is
        asked anything; `command` names what needs them)."""
        entries = tuple(parse_hostfile(hostfile))
        for tool in ("ssh", "scp"):
            if runner.which(tool) is None:
                raise EnvironmentProblem(f"{tool} is not installed on this host; {command} reaches the "
                                         f"{len(entries)} node(s) with it",
                                         hint="install the OpenSSH client (Debian: apt-get install openssh-client)")
        return cls(entries)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(entry.host for entry in self.entries)

    def check_ready(self, python: Path) -> None:
        on_each(list(self.hosts), lambda host: self._check_node(host, python), in_order=True)

    def _check_node(self, host: str, python: Path) -> None:
        gone = remote.check_reachable(host, env=self.env)
        if gone is not None:
            raise gone.error()
        if not remote.run_on(host, ["test", "-x", python], env=self.env).ok:
            raise EnvironmentProblem(f"node {host} has no interpreter at {python}",
                                     hint="create the target environment at the same path on every node (a shared "
                                     "file system does it once)")
        check_tool(host)

    def run_tool(self, host: str, args: Sequence[str | Path], *, patience: Patience,
                 run_id: str | None = None) -> ToolRun:
        return run_tool(host, args, patience=patience, run_id=run_id)

    def run_tool_on_each(self, args: Sequence[str | Path], *, patience: Patience,
                         done: Callable[[str, ToolRun], None] | None = None) -> list[ToolRun]:
        return on_each(list(self.hosts), lambda host: run_tool(host, args, patience=patience), done=done,
                       in_order=True)

    def script_on_each(self, script: str, *, patience: Patience,
                       done: Callable[[ScriptAnswer], None] | None = None) -> list[ScriptAnswer]:
        """One ssh call per node, all at once; a status line as each answers (slow nodes last). Ctrl-C kills
        the ssh calls (read-only work: nothing to finish)."""
        return on_each(list(self.hosts), lambda host: self._script_on(host, script, patience),
                       done=None if done is None else lambda _host, answer: done(answer), kill_on_interrupt=True)

    def _script_on(self, host: str, script: str, patience: Patience) -> ScriptAnswer:
        """`sh -s` with the script on stdin (the remote command stays `sh -s`, which every login shell, csh
        too, passes on unchanged; a multi-line `sh -c` would not), in the background, so that a step that
        hangs there still leaves everything printed before it. What it writes to stderr is its progress
        (`script_on_each`)."""
        try:
            with remote.start_on(host, ["sh", "-s"], input_text=script, patience=patience, env=self.env,
                                 stall_on_stderr=patience.watched) as pending:
                try:
                    result = pending.result()
                except ToolTimedOut as exc:
                    partial = pending.partial_stdout()
                    why = (f"no sign of progress for {patience.stall_s:g} s" if isinstance(exc, ToolStalled)
                           else f"no answer within {patience.ceiling_s:g} s")
                    return ScriptAnswer(host, partial, interrupted=why, timed_out=True)
        except ToolMissing as exc:
            raise EnvironmentProblem("ssh is not installed on this host",
                                     hint="install the OpenSSH client (Debian: apt-get install openssh-client)"
                                     ) from exc
        result = replace(result, stderr=without_beats(result.stderr))
        gone = remote.unreachable(result, host)
        if gone is not None:
            return ScriptAnswer(host, "", unreachable=gone.reason)
        interrupted = None if result.ok else f"the node's script exited with {result.returncode}: {result.tail(1)}"
        return ScriptAnswer(host, result.stdout, interrupted=interrupted)

    def run(self, host: str, argv: Sequence[str | Path], *, patience: Patience = WAITS["ssh command"]
            ) -> runner.RunResult:
        result = remote.run_on(host, argv, patience=patience, env=self.env)
        gone = remote.unreachable(result, host)
        if gone is not None:
            raise gone.error()
        return result

    def sees(self, paths: Sequence[Path]) -> Mapping[str, frozenset[str]]:
        answers = on_each(list(self.hosts), lambda host: self.run(host, ["ls", "-d", "--", *paths]))
        return {host: frozenset(line.strip() for line in answer.stdout.splitlines())
                for host, answer in zip(self.hosts, answers, strict=True)}

    def copy_to(self, host: str, local: Path, remote_parent: Path) -> None:
        remote.copy_to(host, local, remote_parent, env=self.env)

    def copy_from(self, host: str, remote_paths: Sequence[Path], local_dir: Path) -> None:
        """scp; its exit is not read: scp says no alike for a file that is not there and a node that is gone,
        and either way the caller reads what arrived."""
        remote.fetch_from(host, remote_paths, local_dir, env=self.env)

    def lost(self) -> Mapping[str, str]:
        """One `ssh node hostname` per node, all at once."""
        answers = on_each(list(self.hosts),
                          lambda host: remote.check_reachable(host, patience=WAITS["lost-node check"], env=self.env))
        return {gone.host: f"is {self.no_answer}: {gone.reason}" for gone in answers if gone is not None}

    def stop(self, run_id: str) -> None:
        on_each(list(self.hosts), lambda host: remote.stop_marked(host, run_id, env=self.env))

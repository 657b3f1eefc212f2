"""Get every node of a hostfile ready for one launch of the worker through DeepSpeed's launcher, and clean up.

DeepSpeed's pdsh launcher runs, on each node, `cd <this cwd>; <this python> -m deepspeed.launcher.launch
... --module mlstack_verify_worker --out <dir>`: the same paths everywhere. So before the launch each node
is checked (reachable over ssh, the target interpreter at the same path) and the launch directory (the
staged worker and an empty results directory) is made to exist there: nothing to do on a file system the
node shares with this host, an `scp` otherwise. After the launch, the copied nodes' rank logs are fetched
back, every node's processes of this launch are killed (a rank on another node is not this host's child:
when the launcher is killed, it keeps running), and the copies are removed.

Environment: the launcher exports only variables whose names start with a few prefixes (PYTHON...) and
those in a `.deepspeed_env` file; `DS_ENV_FILE` names ours, which carries the user's own
`~/.deepspeed_env` and `./.deepspeed_env` lines, then the variables the ranks need from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster import remote
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.hostfile import HostEntry, rank_layout
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.launch import launcher
from mlstack_ds.worker.protocol import RESULTS_GLOB

ENV_FILE_VARIABLE = "DS_ENV_FILE"
# What the ranks need from this host's environment, by prefix: our own markers and test hooks, DeepSpeed's
# accelerator choice, the interface and transport settings of gloo/NCCL/RCCL, and ROCm's device selection.
FORWARDED_PREFIXES = ("MLSTACK_", "DS_ACCELERATOR", "GLOO_", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCR_",
                      "OMP_", "TORCH_")
DEFAULT_ENV_FILE_NAME = ".deepspeed_env"  # DeepSpeed's default, looked up in $HOME and the working directory


@dataclass(frozen=True)
class Node:
    host: str
    ranks: tuple[int, ...]
    shared: bool  # sees this host's launch directory (shared file system) rather than a copy

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "ranks": list(self.ranks), "files": "shared" if self.shared else "copied"}


def launch_command(python: Path, args: Sequence[str], env: dict[str, str], *, launch_dir: Path, run_id: str,
                   world_size: int, hosts: Sequence[HostEntry] | None, hostfile: Path | None,
                   status: Callable[[str], None]) -> tuple[list[str], list[Node]]:
    """The launcher's argv for one launch of the worker (`args`) and the nodes it runs on: torchrun on this
    machine, or, with a hostfile, DeepSpeed's launcher over `hosts`, after the ranks' env file is written
    into `launch_dir` (`env` then names it) and every node is checked and given the launch directory."""
    if hosts is None or hostfile is None:
        return launcher.torchrun_argv(python, world_size, launcher.free_port(), args), []
    argv = launcher.deepspeed_argv(python, hostfile, hosts, launcher.free_port(), args)
    env_file = write_env_file(launch_dir / "deepspeed_env",
                              {**env, launcher.RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"})
    env[ENV_FILE_VARIABLE] = str(env_file)
    return argv, prepare(hosts, python, launch_dir, env=env, status=status)


def prepare(hosts: Sequence[HostEntry], python: Path, launch_dir: Path, *,
            env: Mapping[str, str] | None = None, status: Callable[[str], None] = lambda _m: None) -> list[Node]:
    """Check every node with ranks and make `launch_dir` exist on it; one status line per node.

    One ssh round trip per node for the checks (plus the copy where needed), all nodes at once (up to
    cluster.fanout): the cost of a large hostfile is then a few round trips, not one per node and check.
    Raises EnvironmentProblem naming every node that cannot take part; nothing has run anywhere then."""
    if runner.which("pdsh", path=(env or {}).get("PATH")) is None:
        raise EnvironmentProblem("pdsh is not installed on this host; DeepSpeed's launcher starts the other "
                                 "nodes' ranks through it",
                                 hint="install it (Debian/Ubuntu: apt-get install pdsh; RHEL: dnf install pdsh)")
    probe = remote.SharedFileProbe.here(launch_dir, "shared-file-system-probe-")
    layout = rank_layout(hosts)

    def one(host: str) -> Node:
        node = Node(host, tuple(layout[host]), _check_node(host, python, probe, env))
        if not node.shared:
            remote.copy_to(host, launch_dir, launch_dir.parent, env=env)
        return node

    def report(host: str, answer: Node | EnvironmentProblem) -> None:
        if isinstance(answer, EnvironmentProblem):
            status(f"{host}: {answer.message}")
        else:
            status(f"{host}: reachable, ranks {_ranks_text(answer.ranks)}, "
                   f"{'shared file system' if answer.shared else 'launch files copied with scp'}")

    try:
        answers = dict(zip(layout, on_each(list(layout), one, catch=EnvironmentProblem, done=report), strict=True))
    finally:
        probe.remove()
    nodes = [a for a in answers.values() if isinstance(a, Node)]
    problems = {h: a for h, a in answers.items() if isinstance(a, EnvironmentProblem)}
    if problems:
        cleanup(nodes, "", launch_dir, env=env)
        first = next(problems[h] for h in layout if h in problems)
        if len(problems) == 1:
            raise first
        others = "; ".join(problems[h].message for h in layout if h in problems)
        raise EnvironmentProblem(f"{len(problems)} nodes cannot take part: {others}", hint=first.hint)
    return nodes


def _check_node(host: str, python: Path, probe: remote.SharedFileProbe, env: Mapping[str, str] | None) -> bool:
    """Reachable, the interpreter there; returns whether the node shares `probe`'s file system (one round
    trip for both)."""
    answer = remote.run_on(host, ["sh", "-c", _CHECK_SCRIPT, "sh", python, probe.path], env=env)
    gone = remote.unreachable(answer, host)
    if gone is not None:
        raise gone.error()
    if "python=yes" not in answer.stdout.splitlines():
        raise EnvironmentProblem(
            f"node {host} has no interpreter at {python}",
            hint="DeepSpeed's launcher starts the same path on every node: create the environment there at that "
            "path (a shared file system does it once)")
    lines = answer.stdout.splitlines()
    return any(probe.matches(line.removeprefix("token=")) for line in lines if line.startswith("token="))


# $1: the interpreter, $2: the file this host just wrote (its content is on the node only if shared)
_CHECK_SCRIPT = ('if test -x "$1"; then echo python=yes; else echo python=no; fi; '
                 'printf "token="; cat "$2" 2>/dev/null; echo')


def finish(nodes: Sequence[Node], run_id: str, launch_dir: Path, results_dir: Path, *,
           env: Mapping[str, str] | None = None) -> None:
    """After the launch, on every node at once: kill what still runs of it (a rank on another node is not
    this host's child and outlives the launcher), then on copied nodes fetch the rank logs (final, since
    their writers are dead) and remove the copy. Best effort: a node that went away keeps what it has."""
    def one(node: Node) -> None:
        remote.kill_marked(node.host, run_id, env=env)
        if not node.shared:
            try:
                remote.fetch_from(node.host, [results_dir / RESULTS_GLOB], results_dir, env=env)
                remote.run_on(node.host, ["rm", "-rf", "--", launch_dir], env=env)
            except EnvironmentProblem:
                return

    on_each(nodes, one)


def cleanup(nodes: Sequence[Node], run_id: str, launch_dir: Path, *, env: Mapping[str, str] | None = None) -> None:
    """Kill this launch's processes on every node (by the run id on their command line) and remove the
    copies of the launch directory, one ssh round trip per node, all at once. Best effort: a node that
    went away keeps what it has."""
    def one(node: Node) -> None:
        if run_id:
            remote.kill_marked(node.host, run_id, env=env)
        if not node.shared:
            try:
                remote.run_on(node.host, ["rm", "-rf", "--", launch_dir], env=env)
            except EnvironmentProblem:
                return

    on_each(nodes, one)


def write_env_file(path: Path, env: Mapping[str, str], *, home: Path | None = None, cwd: Path | None = None) -> Path:
    """The `.deepspeed_env` of this launch: the lines of the files DeepSpeed would have read without us
    (`$DS_ENV_FILE` or `.deepspeed_env`, in $HOME and the working directory) first, then ours (the last
    line of a variable wins)."""
    name = env.get(ENV_FILE_VARIABLE) or DEFAULT_ENV_FILE_NAME
    lines: list[str] = []
    for where in ((home or Path.home()) / name, (cwd or Path.cwd()) / name):
        if where.is_file() and where.resolve() != path.resolve():
            lines += [ln for ln in where.read_text(errors="replace").splitlines() if "=" in ln]
    for key, value in sorted(env.items()):
        if key.startswith(FORWARDED_PREFIXES) and "\n" not in value and value.strip():
            lines.append(f"{key}={value}")
    path.write_text("".join(f"{ln}\n" for ln in lines))
    return path


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}" if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"

"""Get every node of a hostfile ready for one verify launch through DeepSpeed's launcher, and clean up.

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

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.multinode import remote
from mlstack_ds.multinode.hostfile import HostEntry, rank_layout

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


def prepare(hosts: Sequence[HostEntry], python: Path, launch_dir: Path, *,
            env: Mapping[str, str] | None = None, status: Callable[[str], None] = lambda _m: None) -> list[Node]:
    """Check every node with ranks and make `launch_dir` exist on it; one status line per node.

    Raises EnvironmentProblem naming the first node that cannot take part (nothing has run yet)."""
    if runner.which("pdsh", path=(env or {}).get("PATH")) is None:
        raise EnvironmentProblem("pdsh is not installed on this host; DeepSpeed's launcher starts the other "
                                 "nodes' ranks through it",
                                 hint="install it (Debian/Ubuntu: apt-get install pdsh; RHEL: dnf install pdsh)")
    token_file = launch_dir / "shared-file-system-probe"
    token = secrets.token_hex(16)
    token_file.write_text(token)
    nodes: list[Node] = []
    try:
        for host, ranks in rank_layout(hosts).items():
            gone = remote.check_reachable(host, env=env)
            if gone is not None:
                raise gone.error()
            found = remote.run_on(host, ["test", "-x", python], env=env)
            if not found.ok:
                raise EnvironmentProblem(
                    f"node {host} has no interpreter at {python}",
                    hint="DeepSpeed's launcher starts the same path on every node: create the environment there "
                    "at that path (a shared file system does it once)")
            shared = remote.sees_same_file(host, token_file, token, env=env)
            if not shared:
                remote.copy_to(host, launch_dir, launch_dir.parent, env=env)
            nodes.append(Node(host, tuple(ranks), shared))
            status(f"{host}: reachable, ranks {_ranks_text(ranks)}, "
                   f"{'shared file system' if shared else 'launch files copied with scp'}")
    except BaseException:
        cleanup(nodes, "", launch_dir, env=env)
        raise
    finally:
        token_file.unlink(missing_ok=True)
    return nodes


def collect(nodes: Sequence[Node], results_dir: Path, *, env: Mapping[str, str] | None = None) -> None:
    """Fetch what the ranks of copied nodes wrote into their `results_dir` (a dead node gives nothing)."""
    for node in nodes:
        if not node.shared:
            remote.fetch_from(node.host, [results_dir / "rank*.jsonl"], results_dir, env=env)


def cleanup(nodes: Sequence[Node], run_id: str, launch_dir: Path, *, env: Mapping[str, str] | None = None) -> None:
    """Kill this launch's processes on every node (by the run id on their command line) and remove the
    copies of the launch directory. Best effort: a node that went away keeps what it has."""
    for node in nodes:
        if run_id:
            remote.kill_marked(node.host, run_id, env=env)
        if not node.shared:
            try:
                remote.run_on(node.host, ["rm", "-rf", "--", launch_dir], env=env)
            except EnvironmentProblem:
                continue


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

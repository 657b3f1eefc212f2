"""`--hostfile`: the ranks started by DeepSpeed's own launcher, which reaches the nodes through pdsh.

What differs from srun (launch/srun.py) is only this: the launcher's argv (`python -m
deepspeed.launcher.runner --hostfile ...`, master on the first host with slots), pdsh on this host, the
ranks' environment in an env file, and the ranks' exit codes from the launcher's failure summary. Getting
the nodes ready and cleaning up is launch/nodes.py's, over ssh (cluster/ssh_nodes.py).

Environment: the launcher exports only variables whose names start with a few prefixes (PYTHON...) and
those in a `.deepspeed_env` file; `DS_ENV_FILE` names ours, which carries the user's own
`~/.deepspeed_env` and `./.deepspeed_env` lines, then the variables the ranks need from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.launch import launcher
from mlstack_ds.patience import Patience

ENV_FILE_VARIABLE = "DS_ENV_FILE"
# What the ranks need from this host's environment, by prefix: our own markers and test hooks, DeepSpeed's
# accelerator choice, the interface and transport settings of gloo/NCCL/RCCL, and ROCm's device selection.
FORWARDED_PREFIXES = ("MLSTACK_", "DS_ACCELERATOR", "GLOO_", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCR_",
                      "OMP_", "TORCH_")
DEFAULT_ENV_FILE_NAME = ".deepspeed_env"  # DeepSpeed's default, looked up in $HOME and the working directory


@dataclass(frozen=True)
class PdshStart:
    """DeepSpeed's launcher over the nodes of `hostfile` (launch/nodes.RankStart)."""

    hostfile: Path
    name: str = "pdsh"
    progress_visible: bool = False  # the ranks' files of a copied node come back only at the end
    stops_its_ranks: bool = False  # a rank on another node outlives the launcher: finish stops it

    def argv(self, python: Path, args: Sequence[str], hosts: Sequence[HostEntry], *, launch_dir: Path,
             run_id: str, env: dict[str, str]) -> list[str]:
        if runner.which("pdsh", path=env.get("PATH")) is None:
            raise EnvironmentProblem("pdsh is not installed on this host; DeepSpeed's launcher starts the other "
                                     "nodes' ranks through it",
                                     hint="install it (Debian/Ubuntu: apt-get install pdsh; RHEL: dnf install pdsh)")
        env_file = write_env_file(launch_dir / "deepspeed_env",
                                  {**env, launcher.RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"})
        env[ENV_FILE_VARIABLE] = str(env_file)
        return deepspeed_argv(python, self.hostfile, hosts, launcher.free_port(), args)

    def run(self, argv: Sequence[str], *, patience: Patience, run_id: str, env: Mapping[str, str], cwd: Path,
            progress: Callable[[], object] | None) -> launcher.LaunchOutcome:
        return launcher.run_launch(argv, patience=patience, run_id=run_id, env=env, cwd=cwd, progress=progress)


def deepspeed_argv(python: Path, hostfile: Path, hosts: Sequence[HostEntry], port: int,
                   args: Sequence[str], *, gpus_per_node: int | None = None) -> list[str]:
    """Several nodes: DeepSpeed's launcher (pdsh/ssh), master on the first host with a slot (DeepSpeed
    gives rank 0, which serves the rendezvous, to the first host with slots; a `slots=0` host runs none).

    The staged worker and `--out` must exist on every node (same path or a shared file system).
    """
    argv = [str(python), "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile),
            "--master_addr", next((h.host for h in hosts if h.slots), hosts[0].host), "--master_port", str(port)]
    if gpus_per_node is not None:
        argv += ["--num_gpus", str(gpus_per_node)]
    return [*argv, "--module", *args]


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

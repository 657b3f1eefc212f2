"""`--slurm`: the ranks started as srun tasks on an allocation's nodes, one task per rank, and no step left
behind.

What differs from DeepSpeed's pdsh launcher (launch/pdsh.py) is only this: the launcher's argv (srun with
the allocation's job id, the worker's `slurm_env` entry), the rendezvous in the ranks' environment, and the
ranks' exit codes from srun's task lines (and a job's time limit). Getting the nodes ready is
launch/nodes.py's, through srun steps (cluster/srun_nodes.py).

Why one task per rank (RANK/WORLD_SIZE/LOCAL_RANK mapped from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID by
the worker's `slurm_env` entry, MASTER_ADDR the allocation's first node) and not one `torchrun` per node:
both work, but torchrun adds its own agent and rendezvous round per node; measured on the two-node test
cluster, a 2-rank gloo all_reduce took 2.1-3.6 s per task vs 4.8-6.2 s through torchrun at low load (9.6
vs 22.4 s at a load of 18), and with tasks Slurm itself sees, signals and kills every rank (see
docs/multinode.md). No ssh, no pdsh: `srun` reaches the nodes through slurmd.

Stopping: every step, the launch's too, runs through cluster/srun_steps.py: srun is sent SIGTERM on a
time-out or Ctrl-C/SIGTERM, then whatever Slurm still runs of the step is cancelled by name; the launch
returns only once `squeue` lists no step of it. Every step is named after the launch's run id for that.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_steps import find_srun, run_step, step_options
from mlstack_ds.errors import ToolError, ToolStalled, ToolTimedOut
from mlstack_ds.launch import launcher
from mlstack_ds.patience import WAITS, Patience

ENTRY_MODULE = f"{launcher.WORKER_MODULE}.slurm_env"


@dataclass(frozen=True)
class SrunStart:
    """One srun task per rank on the allocation's nodes (launch/nodes.RankStart)."""

    allocation: Allocation
    name: str = "srun"
    progress_visible: bool = True  # srun copies nothing: the launch directory is on a file system all share
    stops_its_ranks: bool = True  # run_step cancels the step until squeue lists it no more

    def argv(self, python: Path, args: Sequence[str], hosts: Sequence[HostEntry], *, launch_dir: Path,
             run_id: str, env: dict[str, str]) -> list[str]:
        srun = find_srun(env)
        env.update(rendezvous_env(hosts))
        return srun_argv(srun, python, args, allocation=self.allocation, hosts=hosts, run_id=run_id)

    def run(self, argv: Sequence[str], *, patience: Patience, run_id: str, env: Mapping[str, str], cwd: Path,
            progress: Callable[[], object] | None) -> launcher.LaunchOutcome:
        return run_launch(argv, patience=patience, job_id=self.allocation.job_id, run_id=run_id, env=env, cwd=cwd,
                          progress=progress)


def srun_argv(srun: Path, python: Path, args: Sequence[str], *, allocation: Allocation,
              hosts: Sequence[HostEntry], run_id: str) -> list[str]:
    """One task per rank: `srun ... PYTHON -m mlstack_verify_worker.slurm_env MODULE ARGS`."""
    return [str(srun), *step_options(allocation, hosts, run_id, hosts[0].slots), str(python), "-m", ENTRY_MODULE,
            *args]


def rendezvous_env(hosts: Sequence[HostEntry]) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT for the ranks: the first node, a port free here (the first node, in an
    sbatch script; from a login node a guess that collides rarely, as torchrun's own choice does)."""
    return {"MASTER_ADDR": hosts[0].host, "MASTER_PORT": str(launcher.free_port("0.0.0.0"))}


def run_launch(argv: Sequence[str], *, patience: Patience, job_id: str, run_id: str, env: Mapping[str, str],
               cwd: Path | None = None, progress: Callable[[], object] | None = None) -> launcher.LaunchOutcome:
    """`launcher.run_launch` for an srun step: the same outcome, and the step gone from every node."""
    launch_env = {**env, launcher.RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        result = run_step(argv, patience=patience, job_id=job_id, run_id=run_id, env=launch_env, cwd=cwd,
                          progress=progress)
    except ToolStalled:
        return launcher.LaunchOutcome(None, time.monotonic() - started, True, "", stalled=True)
    except ToolTimedOut:
        return launcher.LaunchOutcome(None, time.monotonic() - started, True, "")
    except ToolError as exc:
        return launcher.LaunchOutcome(None, time.monotonic() - started, False, exc.message)
    finally:
        launcher.sweep(run_id)
    ended_by = ""
    if result.returncode != 0 and time_limit_reached(job_id, result.stderr, env):
        ended_by = "the job reached its time limit (salloc/sbatch --time): Slurm cancelled the ranks"
    return launcher.LaunchOutcome(result.returncode, result.duration_s, False, result.tail(40),
                                  task_exit_codes(result.stderr + result.stdout), ended_by)


def time_limit_reached(job_id: str, srun_stderr: str, env: Mapping[str, str]) -> bool:
    """Whether Slurm ended job `job_id` at its time limit. srun's "CANCELLED AT ... DUE TO TIME LIMIT" line
    is not always there (srun may end before slurmstepd's message reaches it; then the ranks only show
    "Terminated"), so Slurm is asked too: the job's reason is TimeLimit while it completes and after
    (measured on Slurm 22.05: JobState COMPLETING, then TIMEOUT, Reason=TimeLimit)."""
    if "DUE TO TIME LIMIT" in srun_stderr:
        return True
    squeue = runner.which("squeue", path=env.get("PATH"))
    if squeue is None:
        return False
    with contextlib.suppress(ToolError):
        out = runner.run([squeue, "-h", "-t", "all", "-j", job_id, "-o", "%r"], patience=WAITS["squeue"], env=env)
        return out.ok and out.stdout.strip() == "TimeLimit"
    return False


def task_exit_codes(log: str) -> dict[int, int]:
    """srun's `task 1: Exited with exit code 17` / `tasks 0-1: Killed` lines as {rank: code} (-9: killed)."""
    codes: dict[int, int] = {}
    for match in re.finditer(r"tasks? (\d+)(?:-(\d+))?: (?:Exited with exit code (\d+)|(Killed|Terminated))", log):
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        code = int(match.group(3)) if match.group(3) is not None else (-9 if match.group(4) == "Killed" else -15)
        for rank in range(first, last + 1):
            codes[rank] = code
    return codes

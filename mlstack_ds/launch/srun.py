"""Start the worker on an allocation's nodes with `srun`, one task per rank, and leave no step behind.

Why one task per rank (RANK/WORLD_SIZE/LOCAL_RANK mapped from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID by
the worker's `slurm_env` entry, MASTER_ADDR the allocation's first node) and not one `torchrun` per node:
both work, but torchrun adds its own agent and rendezvous round per node; measured on the two-node test
cluster, a 2-rank gloo all_reduce took 2.1-3.6 s per task vs 4.8-6.2 s through torchrun at low load (9.6
vs 22.4 s at a load of 18), and with tasks Slurm itself sees, signals and kills every rank (see
docs/multinode.md). No ssh, no pdsh: `srun` reaches the nodes through slurmd.

Stopping: srun is started in a session of its own; on a time-out or Ctrl-C/SIGTERM it gets SIGTERM (srun
then SIGKILLs the step's tasks on every node; a SIGKILLed srun would leave them running), and whatever
the step still has afterwards is cancelled by name (`scancel --signal=KILL JOB.STEP`); the launch returns
only once `squeue` lists no step of it. Every step is named after the launch's run id for that.
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
from mlstack_ds.errors import EnvironmentProblem, ToolError, ToolStalled, ToolTimedOut
from mlstack_ds.launch import labelled, launcher

ENTRY_MODULE = f"{launcher.WORKER_MODULE}.slurm_env"
TERMINATE_GRACE_S = 30.0  # srun's own teardown after SIGTERM: seconds idle, more under load
STEP_GONE_TIMEOUT_S = 120.0  # until squeue no longer lists a cancelled step (KillWait 30 s by default, load)
CHECK_TIMEOUT_S = 180.0  # the per-node pre-launch step: an srun of `ls`, tens of seconds under a load of 15+
SQUEUE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SlurmNode:
    host: str
    ranks: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "ranks": list(self.ranks), "files": "shared", "launcher": "srun"}


def step_options(allocation: Allocation, hosts: Sequence[HostEntry], name: str, tasks_per_node: int) -> list[str]:
    """srun's options for one step on `hosts` (a prefix of the allocation's nodes), `tasks_per_node` each."""
    return [f"--jobid={allocation.job_id}", f"--nodes={len(hosts)}", f"--nodelist={','.join(h.host for h in hosts)}",
            f"--ntasks={len(hosts) * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}", f"--job-name={name}",
            "--export=ALL", "--kill-on-bad-exit=1"]


def srun_argv(srun: Path, python: Path, args: Sequence[str], *, allocation: Allocation,
              hosts: Sequence[HostEntry], run_id: str) -> list[str]:
    """One task per rank: `srun ... PYTHON -m mlstack_verify_worker.slurm_env MODULE ARGS`."""
    return [str(srun), *step_options(allocation, hosts, run_id, hosts[0].slots), str(python), "-m", ENTRY_MODULE,
            *args]


def rendezvous_env(hosts: Sequence[HostEntry]) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT for the ranks: the first node, a port free here (the first node, in an
    sbatch script; from a login node a guess that collides rarely, as torchrun's own choice does)."""
    return {"MASTER_ADDR": hosts[0].host, "MASTER_PORT": str(launcher.free_port("0.0.0.0"))}


def find_srun(env: Mapping[str, str]) -> Path:
    srun = runner.which("srun", path=env.get("PATH"))
    if srun is None:
        raise EnvironmentProblem("srun is not on PATH: --slurm starts the ranks with it",
                                 hint="load the Slurm client (e.g. `module load slurm`) or put its bin on PATH")
    return srun


def check_nodes(python: Path, launch_dir: Path, *, allocation: Allocation, hosts: Sequence[HostEntry],
                run_id: str, env: Mapping[str, str], status: Callable[[str], None]) -> list[SlurmNode]:
    """One task per node (`ls -d` of the interpreter and the launch directory): every node has `python` and
    sees this host's launch directory (a shared file system: srun copies nothing). One srun step; raises
    EnvironmentProblem naming every node that cannot take part, before any rank starts."""
    try:
        answers, result = on_each_node(allocation, [h.host for h in hosts], ["ls", "-d", "--", python, launch_dir],
                                       timeout_s=CHECK_TIMEOUT_S, env=env, name=f"{run_id}-check")
    except ToolTimedOut as exc:
        raise EnvironmentProblem(f"srun did not start a task on every node within {CHECK_TIMEOUT_S:g} s",
                                 hint="is the allocation still running (`squeue -j "
                                 f"{allocation.job_id}`)? are its nodes up (`sinfo`)?") from exc
    problems, layout, next_rank = [], [], 0
    for host in hosts:
        ranks = tuple(range(next_rank, next_rank + host.slots))
        next_rank += host.slots
        found = {path.strip() for path in answers.get(host.host, "").splitlines()}
        if not found and result.returncode != 0:
            problems.append(f"node {host.host} ran no task ({_last_line(result.stderr)})")
        elif str(python) not in found:
            problems.append(f"node {host.host} has no interpreter at {python}")
        elif str(launch_dir) not in found:
            problems.append(f"node {host.host} does not see {launch_dir} (not a shared file system)")
        else:
            status(f"{host.host}: ranks {ranks[0]}-{ranks[-1]}, srun step of job {allocation.job_id}"
                   if len(ranks) > 1 else f"{host.host}: rank {ranks[0]}, srun step of job {allocation.job_id}")
            layout.append(SlurmNode(host.host, ranks))
    if problems:
        hint = ("the launch files go under TMPDIR: point it at a directory every node sees (e.g. "
                "`TMPDIR=$HOME/tmp`), and create --python's environment at the same path on every node "
                "(a shared file system does both)")
        raise EnvironmentProblem(problems[0] if len(problems) == 1 else
                                 f"{len(problems)} nodes cannot take part: {'; '.join(problems)}", hint=hint)
    return layout


def run_step(argv: Sequence[str], *, timeout_s: float, job_id: str, run_id: str, env: Mapping[str, str],
             cwd: Path | None = None, input_text: str | None = None, stall_s: float | None = None,
             progress: Callable[[], object] | None = None) -> runner.RunResult:
    """Run one srun step to completion or time-out (`stall_s`, `progress`: see `runner.wait_patiently`);
    afterwards no task of it is left on any node."""
    try:
        return runner.run(argv, timeout=timeout_s, env=env, cwd=cwd, terminate_s=TERMINATE_GRACE_S,
                          input_text=input_text, stall_s=stall_s, progress=progress)
    finally:  # also on Ctrl-C/SIGTERM: srun had its SIGTERM; what Slurm still runs of the step is cancelled
        stop_steps(job_id, run_id, env)


def run_launch(argv: Sequence[str], *, timeout_s: float, job_id: str, run_id: str, env: Mapping[str, str],
               cwd: Path | None = None, stall_s: float | None = None,
               progress: Callable[[], object] | None = None) -> launcher.LaunchOutcome:
    """`launcher.run_launch` for an srun step: the same outcome, and the step gone from every node."""
    launch_env = {**env, launcher.RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        result = run_step(argv, timeout_s=timeout_s, job_id=job_id, run_id=run_id, env=launch_env, cwd=cwd,
                          stall_s=stall_s, progress=progress)
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
        out = runner.run([squeue, "-h", "-t", "all", "-j", job_id, "-o", "%r"], timeout=SQUEUE_TIMEOUT_S, env=env)
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


def live_steps(job_id: str, name: str, env: Mapping[str, str]) -> list[str]:
    """The step ids (`JOB.STEP`) of job `job_id` named `name` that Slurm still lists."""
    squeue = runner.which("squeue", path=env.get("PATH"))
    if squeue is None:
        return []
    with contextlib.suppress(ToolError):
        out = runner.run([squeue, "-h", "-s", "-j", job_id, "-o", "%i|%j"], timeout=SQUEUE_TIMEOUT_S, env=env)
        return [step for step, _, step_name in (line.partition("|") for line in out.stdout.splitlines())
                if step_name.strip() == name]
    return []


def stop_steps(job_id: str, name: str, env: Mapping[str, str], timeout_s: float = STEP_GONE_TIMEOUT_S) -> list[str]:
    """SIGKILL every task of the steps named `name` (`scancel`) until squeue lists none; returns what is left
    after `timeout_s` (empty: nothing of the launch runs on any node). One squeue call when already gone."""
    deadline = time.monotonic() + timeout_s
    scancel = runner.which("scancel", path=env.get("PATH"))
    while True:
        steps = live_steps(job_id, name, env)
        if not steps or time.monotonic() > deadline:
            return steps
        if scancel is not None:
            with contextlib.suppress(ToolError):
                runner.run([scancel, "--signal=KILL", *steps], timeout=SQUEUE_TIMEOUT_S, env=env)
        time.sleep(0.5)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def on_each_node(allocation: Allocation, hosts: Sequence[str], argv: Sequence[str | Path], *, timeout_s: float,
                 env: Mapping[str, str], input_text: str | None = None,
                 name: str | None = None) -> tuple[dict[str, str], runner.RunResult]:
    """`argv` once on each of `hosts` in one srun step (one task per node, `--label`, named `name`); returns
    each node's own stdout, whole (`labelled`: a node whose task printed nothing is absent), and the step's
    result. Raises ToolTimedOut after `timeout_s`, with the step gone."""
    entries = [HostEntry(host, 1) for host in hosts]
    name = name or f"{launcher.new_run_id()}-each"
    command = [str(find_srun(env)), *step_options(allocation, entries, name, 1), "--label",
               *(["--input=all"] if input_text is not None else []), *labelled.wrapped([str(a) for a in argv])]
    result = run_step(command, timeout_s=timeout_s, job_id=allocation.job_id, run_id=name, env=env,
                      input_text=input_text)
    outputs = labelled.task_outputs(result.stdout)
    return {hosts[task]: text for task, text in outputs.items() if task < len(hosts)}, result


def on_node(allocation: Allocation, host: str, argv: Sequence[str | Path], *, timeout_s: float,
            env: Mapping[str, str]) -> runner.RunResult:
    """`argv` as one task on `host` (an srun step of one task), like `ssh host argv`; ToolTimedOut after
    `timeout_s`, with the step gone."""
    name = f"{launcher.new_run_id()}-on"
    command = [str(find_srun(env)), *step_options(allocation, [HostEntry(host, 1)], name, 1), *map(str, argv)]
    return run_step(command, timeout_s=timeout_s, job_id=allocation.job_id, run_id=name, env=env)

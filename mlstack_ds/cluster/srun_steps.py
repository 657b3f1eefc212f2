"""srun steps on an allocation's nodes: a command on each node (one task per node) or on one, and no step
left behind.

Why here and not beside the rank launch (launch/srun.py): installing, doctor and the launch all reach the
allocation's nodes through these steps; they are how `--slurm` reaches a node, as ssh is for `--hostfile`
(cluster/remote.py).

Stopping: srun is started in a session of its own; on a time-out or Ctrl-C/SIGTERM it gets SIGTERM (srun
then SIGKILLs the step's tasks on every node; a SIGKILLed srun would leave them running), and whatever
the step still has afterwards is cancelled by name (`scancel --signal=KILL JOB.STEP`); a step returns
only once `squeue` lists no step of its name.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster import labelled
from mlstack_ds.cluster.hostfile import HostEntry
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.errors import EnvironmentProblem, ToolError, ToolStalled
from mlstack_ds.patience import WAITS, Patience


def step_name(kind: str) -> str:
    """A step name of its own, so that exactly this step can be found and cancelled afterwards."""
    return f"mlstack-verify-{uuid.uuid4().hex[:16]}-{kind}"


def step_options(allocation: Allocation, hosts: Sequence[HostEntry], name: str, tasks_per_node: int, *,
                 overlap: bool = False) -> list[str]:
    """srun's options for one step on `hosts` (a prefix of the allocation's nodes), `tasks_per_node` each;
    `overlap`: sharing the CPUs of steps that still hold them (one left on a node that went silent)."""
    return [f"--jobid={allocation.job_id}", f"--nodes={len(hosts)}", f"--nodelist={','.join(h.host for h in hosts)}",
            f"--ntasks={len(hosts) * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}", f"--job-name={name}",
            "--export=ALL", "--kill-on-bad-exit=1", *(["--overlap"] if overlap else [])]


def find_srun(env: Mapping[str, str]) -> Path:
    srun = runner.which("srun", path=env.get("PATH"))
    if srun is None:
        raise EnvironmentProblem("srun is not on PATH: --slurm starts the ranks with it",
                                 hint="load the Slurm client (e.g. `module load slurm`) or put its bin on PATH")
    return srun


def run_step(argv: Sequence[str], *, patience: Patience, job_id: str, run_id: str, env: Mapping[str, str],
             cwd: Path | None = None, input_text: str | None = None,
             progress: Callable[[], object] | None = None, stall_on_stderr: bool = False) -> runner.RunResult:
    """Run one srun step to completion or time-out (`patience`, `progress`, `stall_on_stderr`: see `runner.run`);
    afterwards no task of it is left on any node, except on a node that went silent (below)."""
    gone = WAITS["srun step gone"]
    try:
        return runner.run(argv, patience=patience, env=env, cwd=cwd,
                          terminate_s=WAITS["srun terminate grace"].ceiling_s, input_text=input_text,
                          progress=progress, stall_on_stderr=stall_on_stderr)
    except ToolStalled:
        if stall_on_stderr:
            # its tasks' heartbeat stopped: their node does not answer, so the cancel cannot reach it and
            # squeue lists the step until slurmctld marks the node down (minutes); waiting for that only
            # delays the rollback of the nodes that do answer
            gone = WAITS["srun silent step gone"]
        raise
    finally:  # also on Ctrl-C/SIGTERM: srun had its SIGTERM; what Slurm still runs of the step is cancelled
        stop_steps(job_id, run_id, env, gone)


def live_steps(job_id: str, name: str, env: Mapping[str, str]) -> list[str]:
    """The step ids (`JOB.STEP`) of job `job_id` named `name` that Slurm still lists."""
    squeue = runner.which("squeue", path=env.get("PATH"))
    if squeue is None:
        return []
    with contextlib.suppress(ToolError):
        out = runner.run([squeue, "-h", "-s", "-j", job_id, "-o", "%i|%j"], patience=WAITS["squeue"], env=env)
        return [step for step, _, step_name in (line.partition("|") for line in out.stdout.splitlines())
                if step_name.strip() == name]
    return []


def stop_steps(job_id: str, name: str, env: Mapping[str, str], patience: Patience = WAITS["srun step gone"]
               ) -> list[str]:
    """SIGKILL every task of the steps named `name` (`scancel`) until squeue lists none; returns what is left
    after `patience.ceiling_s` (empty: nothing of the launch runs on any node). One squeue call when already gone."""
    deadline = time.monotonic() + patience.ceiling_s
    scancel = runner.which("scancel", path=env.get("PATH"))
    while True:
        steps = live_steps(job_id, name, env)
        if not steps or time.monotonic() > deadline:
            return steps
        if scancel is not None:
            with contextlib.suppress(ToolError):
                runner.run([scancel, "--signal=KILL", *steps], patience=WAITS["squeue"], env=env)
        time.sleep(0.5)


def on_each_node(allocation: Allocation, hosts: Sequence[str], argv: Sequence[str | Path], *, patience: Patience,
                 env: Mapping[str, str], input_text: str | None = None,
                 name: str | None = None, overlap: bool = False, stall_on_stderr: bool = False
                 ) -> tuple[dict[str, str], runner.RunResult]:
    """`argv` once on each of `hosts` in one srun step (one task per node, `--label`, named `name`; `overlap`:
    see `step_options`; `stall_on_stderr`: see `runner.run`); returns each node's own stdout, whole
    (`labelled`: a node whose task printed nothing is absent), and the step's result. Raises ToolTimedOut
    after `patience`, with the step gone."""
    entries = [HostEntry(host, 1) for host in hosts]
    name = name or step_name("each")
    command = [str(find_srun(env)), *step_options(allocation, entries, name, 1, overlap=overlap), "--label",
               *(["--input=all"] if input_text is not None else []), *labelled.wrapped([str(a) for a in argv])]
    result = run_step(command, patience=patience, job_id=allocation.job_id, run_id=name, env=env,
                      input_text=input_text, stall_on_stderr=stall_on_stderr)
    outputs = labelled.task_outputs(result.stdout)
    return {hosts[task]: text for task, text in outputs.items() if task < len(hosts)}, result


def on_node(allocation: Allocation, host: str, argv: Sequence[str | Path], *, patience: Patience,
            env: Mapping[str, str], name: str | None = None, stall_on_stderr: bool = False) -> runner.RunResult:
    """`argv` as one task on `host` (an srun step of one task, named `name`), like `ssh host argv`;
    ToolTimedOut after `patience`, with the step gone (`stall_on_stderr`: see `runner.run`)."""
    name = name or step_name("on")
    command = [str(find_srun(env)), *step_options(allocation, [HostEntry(host, 1)], name, 1), *map(str, argv)]
    return run_step(command, patience=patience, job_id=allocation.job_id, run_id=name, env=env,
                    stall_on_stderr=stall_on_stderr)

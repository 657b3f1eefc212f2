"""`--slurm`: the seam (cluster/transport.py) through srun steps of the allocation the tool runs in.

What differs from ssh: every node at once is one step (one task per node, cluster/srun_steps.py), not one
connection per node; srun copies no files, so whatever a node needs from this host must be on a file system
they share; a node's exit code is not the step's, so a node's answer is read from its own `--json` document.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.cluster.heartbeat import without_beats
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_steps import find_srun, on_each_node, on_node, stop_steps
from mlstack_ds.cluster.tool import (
    ToolRun,
    answered_code,
    beating_tool_argv,
    parse_document,
    tool_timed_out,
)
from mlstack_ds.cluster.transport import ScriptAnswer
from mlstack_ds.errors import EnvironmentProblem, MlstackError, ToolError, ToolStalled, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience

# One step for all nodes starts and ends slower than one ssh call (slurmctld, slurmd and every task's
# start), most under load: a script's time per node is given this much more as a whole step.
STEP_SLACK = 2.0
# `sh -c ALWAYS_ZERO sh ARGV...`: the task ends 0 whatever ARGV's exit, so that srun's --kill-on-bad-exit does
# not end the other nodes' tasks when one node's tool says no (its document carries its exit code).
ALWAYS_ZERO = '"$@"; exit 0'
# `sh -c SEES sh PATH...`: the marker, then the paths that exist there, and exit 0 (see `sees`)
SEES_MARKER = "mlstack-ds: node answered"
SEES = f'echo "{SEES_MARKER}"; ls -d -- "$@" 2>/dev/null; exit 0'
# srun's own line for a node it could not start a task on (launch/slurm's launch_p_step_launch)
LAUNCH_FAILED = re.compile(r"Task launch for \S+ failed on node (\S+): (.+)$", re.MULTILINE)


def _silence_rule(patience: Patience) -> Patience:
    """`patience` with the heartbeat's stall rule: a task silent for WAITS["silent node"] is given up."""
    return patience.with_stall(WAITS["silent node"].ceiling_s)


@dataclass(frozen=True)
class SrunNodes:
    """The nodes of the Slurm allocation this process runs in, reached by srun steps."""

    allocation: Allocation
    env: Mapping[str, str]
    option: str = "--slurm"
    reached_by: str = "srun"
    no_answer: str = "no answer from srun"
    copies_files: bool = False

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.allocation.nodes

    def check_ready(self, python: Path) -> None:
        """srun here; a node without the tool or `python` says so in `run_tool_on_each`'s one step (a step of
        its own for the check would cost every node's task start again)."""
        find_srun(self.env)

    def run_tool(self, host: str, args: Sequence[str | Path], *, patience: Patience,
                 run_id: str | None = None) -> ToolRun:
        """One step, named `run_id` when given (what `stop` cancels), the tool under a heartbeat
        (cluster/heartbeat.py): a node that prints nothing for WAITS["silent node"] is taken for lost and the
        step given up, where srun alone would wait for it until slurmctld marks it down."""
        silent_s = WAITS["silent node"].ceiling_s
        try:
            result = on_node(self.allocation, host, beating_tool_argv([*args, "--json"]),
                             patience=_silence_rule(patience), env=self.env, name=run_id, stall_on_stderr=True)
        except ToolStalled as exc:
            raise EnvironmentProblem(f"node {host}: mlstack-ds {args[0]} went silent (no heartbeat for {silent_s:g} s)",
                                     hint=f"is {host} still up and reachable (`sinfo -n {host}`)?") from exc
        except ToolTimedOut as exc:
            raise tool_timed_out(host, args, patience) from exc
        return ToolRun(result.returncode, parse_document(result.stdout), without_beats(result.stderr))

    def run_tool_on_each(self, args: Sequence[str | Path], *, patience: Patience,
                         done: Callable[[str, ToolRun], None] | None = None) -> list[ToolRun]:
        """One step; each node's answer is its own document, with the step's stderr for a node that printed
        none (srun's word on why its task did not run, or the tool's traceback). Under the heartbeat, as
        `run_tool`: once the other nodes have answered, a node that went silent ends the step."""
        silent_s = WAITS["silent node"].ceiling_s
        try:
            answers, result = on_each_node(self.allocation, list(self.hosts),
                                           ["sh", "-c", ALWAYS_ZERO, "sh", *beating_tool_argv([*args, "--json"])],
                                           patience=_silence_rule(patience), env=self.env,
                                           stall_on_stderr=True)
        except ToolStalled as exc:
            named = "".join(f"; node {host} {why}" for host, why in self.lost().items())
            raise EnvironmentProblem(f"mlstack-ds {args[0]} went silent on a node (no heartbeat for {silent_s:g} s)"
                                     f"{named}", hint=self._allocation_hint) from exc
        except ToolTimedOut as exc:
            raise EnvironmentProblem(f"mlstack-ds {args[0]} did not finish on every node within "
                                     f"{patience.ceiling_s:g} s",
                                     hint=f"is the allocation still running (`squeue -j {self.allocation.job_id}`)?"
                                     ) from exc
        runs, stderr = [], without_beats(result.stderr)
        for host in self.hosts:
            document = parse_document(answers.get(host, ""))
            run = ToolRun(answered_code(document, result.returncode), document, stderr)
            if done is not None:
                done(host, run)
            runs.append(run)
        return runs

    def script_on_each(self, script: str, *, patience: Patience,
                       done: Callable[[ScriptAnswer], None] | None = None) -> list[ScriptAnswer]:
        """One step of `sh -s` with the script as every task's stdin; a node whose task printed nothing did
        not answer. The stall rule watches the step's stderr, every node's together (`script_on_each`)."""
        step = Patience(ceiling_s=patience.ceiling_s * STEP_SLACK, stall_s=patience.stall_s)
        try:
            outputs, result = on_each_node(self.allocation, list(self.hosts), ["sh", "-s"], input_text=script,
                                           patience=step, env=self.env, stall_on_stderr=step.watched)
            silent = f"its srun task did not answer (srun exit {result.returncode})"
        except ToolStalled:
            outputs, silent = {}, f"its srun task showed no sign of progress for {step.stall_s:g} s"
        except ToolTimedOut:
            outputs, silent = {}, f"its srun task did not answer within {step.ceiling_s:g} s"
        answers = []
        for host in self.hosts:
            answer = (ScriptAnswer(host, outputs[host]) if host in outputs
                      else ScriptAnswer(host, "", unreachable=silent))
            if done is not None:
                done(answer)
            answers.append(answer)
        return answers

    def run(self, host: str, argv: Sequence[str | Path], *, patience: Patience = WAITS["srun check step"]
            ) -> runner.RunResult:
        return on_node(self.allocation, host, argv, patience=patience, env=self.env)

    def sees(self, paths: Sequence[Path]) -> Mapping[str, frozenset[str]]:
        """One step of `ls -d`; each task answers (a marker line first) and ends 0, so that a node missing a path
        neither ends the others' tasks (`--kill-on-bad-exit`) nor passes for a node that ran nothing."""
        try:
            answers, result = on_each_node(self.allocation, list(self.hosts), ["sh", "-c", SEES, "sh", *paths],
                                           patience=WAITS["srun check step"], env=self.env)
        except ToolTimedOut as exc:
            raise EnvironmentProblem("srun did not start a task on every node within "
                                     f"{WAITS['srun check step'].ceiling_s:g} s",
                                     hint=self._allocation_hint) from exc
        seen = {}
        for host in self.hosts:
            lines = [line.strip() for line in answers.get(host, "").splitlines()]
            if SEES_MARKER not in lines:
                raise EnvironmentProblem(f"node {host} ran no task ({result.tail(1) or 'no output'})",
                                         hint=self._allocation_hint)
            seen[host] = frozenset(line for line in lines if line and line != SEES_MARKER)
        return seen

    @property
    def _allocation_hint(self) -> str:
        return f"is the allocation still running (`squeue -j {self.allocation.job_id}`)? are its nodes up (`sinfo`)?"

    def copy_to(self, host: str, local: Path, remote_parent: Path) -> None:
        raise EnvironmentProblem(f"node {host}: srun copies no files ({local} is not on a file system it shares)",
                                 hint="put it on a file system every node sees (e.g. under $HOME)")

    def copy_from(self, host: str, remote_paths: Sequence[Path], local_dir: Path) -> None:
        raise EnvironmentProblem(f"node {host}: srun copies no files back ({local_dir} is not on a file system it "
                                 "shares)", hint="put it on a file system every node sees (e.g. under $HOME)")

    def lost(self) -> Mapping[str, str]:
        """The nodes that no longer answer Slurm, and why: those `sinfo` shows not responding (a `*` after the
        state: slurmctld's messages to that slurmd, the step's cancel among them, got no answer) or down; when
        it shows none, those that srun cannot start a task on now (one step of `true`; srun names each:
        `Task launch for StepId=J.S failed on node N: Communication connection failure`).

        Why both: slurmctld notices a lost node only when its next ping goes unanswered (SlurmdTimeout/3
        apart: minutes), so right after a node is lost (a step that could not start there, as when its link
        went down) sinfo still shows it up, and only a launch there tells. Why not the step when sinfo
        names a node: a step whose cancel that node never answered keeps the job's CPUs, so a new step
        waits for them (measured: verify's lost node then took 430 s instead of under 360 s)."""
        states: dict[str, str] = {}
        sinfo = runner.which("sinfo", path=self.env.get("PATH"))
        if sinfo is not None:
            try:
                out = runner.run([sinfo, "-h", "-N", "-n", ",".join(self.hosts), "-o", "%N %T"],
                                 patience=WAITS["squeue"], env=self.env)
                states = dict(line.split(None, 1) for line in out.stdout.splitlines() if len(line.split()) == 2)
            except ToolError:
                pass
        lost = {host: f"does not answer Slurm (sinfo: {states[host]})" for host in self.hosts
                if states.get(host, "").endswith("*") or states.get(host, "").startswith("down")}
        return lost or self._unlaunchable(self.hosts)

    def _unlaunchable(self, hosts: Sequence[str]) -> dict[str, str]:
        """Those of `hosts` that srun names as a node it could not start a task on, in one step of `true`
        (a node it does not name is not taken for lost: with --kill-on-bad-exit, one node's failed launch
        can end the others' tasks before they print). `--overlap`: a step given up on a node that went silent
        still holds the job's CPUs there, and a step without it would wait for them instead of launching."""
        try:
            _answers, result = on_each_node(self.allocation, list(hosts), ["true"], patience=WAITS["srun check step"],
                                            env=self.env, overlap=True)
        except MlstackError:  # no srun, or a step that did not end in time: nothing tells
            return {}
        failed = {match.group(1): match.group(2).strip() for match in LAUNCH_FAILED.finditer(result.stderr)}
        return {host: f"does not answer Slurm (srun: {failed[host]})" for host in hosts if host in failed}

    def stop(self, run_id: str) -> None:
        stop_steps(self.allocation.job_id, run_id, self.env)

"""The srun side of the node seam (`SrunNodes`) through a stand-in `srun` on PATH that runs each task here,
one after the other, with `--label` as srun labels: what the seam's callers get from one step (each node's
own answer, its exit code from its document, a node that printed nothing) without a Slurm cluster. The real
one is tests/multinode's."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlstack_ds.cluster import srun_nodes
from mlstack_ds.cluster.slurm import Allocation
from mlstack_ds.cluster.srun_nodes import SrunNodes
from mlstack_ds.errors import EnvironmentProblem
from mlstack_ds.patience import Patience

FAKE_SRUN = f"""#!{sys.executable}
import os, subprocess, sys
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
stdin = sys.stdin.read() if "input" in opts else None
code = 0
for task, node in enumerate(opts["nodelist"].split(",")):
    if node == os.environ.get("FAKE_SRUN_DOWN"):
        sys.stderr.write(f"srun: error: {{node}}: task {{task}}: Unable to contact slurm controller\\n")
        code = 1
        continue
    if node == os.environ.get("FAKE_SRUN_LAUNCH_FAILS"):  # its link down: srun's own words
        sys.stderr.write(f"srun: error: Task launch for StepId=42.0 failed on node {{node}}: "
                         "Communication connection failure\\n")
        code = 1
        continue
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, env={{**os.environ, "FAKE_NODE": node}})
    out = "".join(f"{{task}}: {{line}}\\n" for line in done.stdout.splitlines()) if "label" in opts else done.stdout
    sys.stdout.write(out)
    sys.stderr.write(done.stderr)
    code = code or done.returncode
sys.exit(code)
"""

# the "tool" on each node: node b says no, with its own exit code, as `mlstack-ds ... --json` does
FAKE_TOOL = """import json, os, sys
if os.environ["FAKE_NODE"] == "b":
    print(json.dumps({"error": {"message": "no bundle here", "hint": "", "exit_code": 7}}))
    sys.exit(7)
print(json.dumps({"action": "plan", "args": sys.argv[1:]}))
"""


@pytest.fixture
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SrunNodes:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "squeue").write_text("#!/bin/sh\n")  # no step of ours is left: it lists none
    for tool in ("srun", "squeue"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setattr(srun_nodes, "beating_tool_argv", lambda args, run_id=None: [
        sys.executable, "-m", "mlstack_ds.cluster.heartbeat", "--", sys.executable, "-c", FAKE_TOOL, *map(str, args)])
    return SrunNodes(Allocation("42", ("a", "b"), None), {"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_each_nodes_answer_comes_from_one_step_with_its_own_exit_code(nodes: SrunNodes) -> None:
    seen: list[str] = []
    runs = nodes.run_tool_on_each(["install", "--dry-run"], patience=Patience(60),
                                  done=lambda host, _run: seen.append(host))
    assert seen == ["a", "b"]
    assert (runs[0].returncode, runs[0].document) == (0, {"action": "plan", "args": ["install", "--dry-run",
                                                                                     "--json"]})
    assert (runs[1].returncode, runs[1].error_message()) == (7, "no bundle here")


def test_one_node_on_its_own(nodes: SrunNodes) -> None:
    """Under the heartbeat (the real one; only the tool is a stand-in): its beats are not the node's words."""
    run = nodes.run_tool("b", ["rollback"], patience=Patience(60))
    assert (run.ok, run.returncode, run.error_message()) == (False, 7, "no bundle here")
    assert run.stderr == ""


def test_which_files_written_here_each_node_sees(nodes: SrunNodes, tmp_path: Path) -> None:
    here = tmp_path / "probe"
    here.write_text("x")
    assert nodes.sees([here, tmp_path / "missing"]) == {"a": frozenset({str(here)}), "b": frozenset({str(here)})}


def test_a_node_that_ran_no_task_is_named_not_taken_for_one_that_sees_nothing(nodes: SrunNodes,
                                                                            tmp_path: Path) -> None:
    """Before: `sees` answered b as seeing nothing, and a launch said "node b has no interpreter"."""
    here = tmp_path / "probe"
    here.write_text("x")
    down = replace(nodes, env={**nodes.env, "FAKE_SRUN_DOWN": "b"})
    with pytest.raises(EnvironmentProblem) as gone:
        down.sees([here])
    assert gone.value.message == "node b ran no task (srun: error: b: task 1: Unable to contact slurm controller)"
    assert "squeue -j 42" in gone.value.hint
    assert nodes.sees([tmp_path / "missing"]) == {"a": frozenset(), "b": frozenset()}  # answered, saw nothing


def test_a_node_srun_cannot_start_a_task_on_is_lost_though_sinfo_does_not_know_yet(nodes: SrunNodes) -> None:
    """Before: `lost` read only sinfo, which shows a node up until slurmctld's next ping (minutes), so an install
    whose step could not start on a node whose link had just gone down said "install failed: srun: Job step
    aborted" (exit 7) instead of naming the node as lost (exit 3)."""
    down = replace(nodes, env={**nodes.env, "FAKE_SRUN_LAUNCH_FAILS": "b"})
    assert down.lost() == {"b": "does not answer Slurm (srun: Communication connection failure)"}
    assert nodes.lost() == {}


def test_a_script_on_every_node_and_a_node_that_printed_nothing(nodes: SrunNodes) -> None:
    answers = nodes.script_on_each('[ "$FAKE_NODE" = b ] || echo "hello from $FAKE_NODE"', patience=Patience(60))
    assert [(a.host, a.stdout, a.unreachable) for a in answers] == [
        ("a", "hello from a\n", None), ("b", "", "its srun task did not answer (srun exit 0)")]
    assert not nodes.copies_files and nodes.option == "--slurm"

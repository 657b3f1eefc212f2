"""`verify --slurm` for real: inside `salloc -N2` on the two-node Slurm cluster (tests/support/slurm_cluster.py),
the CLI runs on the login node (node a, also the first allocated node), finds the nodes from the allocation
and starts one srun task per rank on both; nothing of a launch is left on either node afterwards, also when
the CLI gets SIGTERM, when the job is cancelled, or when a rank hangs until the time-out. Outside an
allocation `--slurm` is a one-line usage error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import cli_argv, run_cli
from support.slurm_cluster import SlurmCluster
from support.target_env import TargetVenv
from support.two_hosts import REPO_ROOT

from mlstack_ds.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # copies or runs the installed target

ZERO = ("zero1", "zero2", "zero3")
LEFTOVER_BOUND = 120  # seconds for Slurm's cleanup (KillWait 5 s) under a load of 15+


def cli_env(**extra: str) -> dict[str, str]:
    """The CLI's environment inside the job: this checkout first on PYTHONPATH (srun passes it to the tasks)."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200", **extra}


def in_allocation(slurm: SlurmCluster, *args: str | Path, env: dict[str, str] | None = None,
                  options: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    """`salloc -N2 -- mlstack-ds ARGS --json` on the login node: exit code, the JSON document, stderr."""
    out = slurm.salloc(cli_argv(*args, "--json"), env=env or cli_env(), options=options, timeout=1800)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def assert_nothing_left(slurm: SlurmCluster) -> None:
    assert slurm.wait_no_leftovers(LEFTOVER_BOUND) == {}
    assert slurm.wait_squeue_empty(LEFTOVER_BOUND) == []


def test_slurm_outside_an_allocation_is_a_one_line_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = run_cli("verify", "--slurm", "--python", sys.executable, base_env=env)
    assert result.returncode == ExitCode.USAGE
    error, hint = result.one_error()
    assert error == "error: --slurm needs a Slurm allocation: SLURM_JOB_ID is not set here"
    assert "salloc" in hint and "sbatch" in hint
    assert result.stdout == ""


def test_slurm_and_hostfile_together_are_a_usage_error(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=1\n")
    result = run_cli("verify", "--slurm", "--hostfile", hostfile, "--python", sys.executable,
                     env={"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a"})
    assert result.returncode == ExitCode.USAGE
    assert result.one_error()[0] == "error: --slurm cannot be combined with --hostfile"


def test_verify_slurm_passes_zero_1_2_3_on_both_nodes(slurm: SlurmCluster, target_venv: TargetVenv) -> None:
    """The issue's "done when": every ZeRO stage passes on both ranks, one rank on each node, both named."""
    started = time.monotonic()
    code, report, stderr = in_allocation(slurm, "verify", "--slurm", "--python", target_venv.python,
                                         "--only", ",".join(ZERO))
    assert code == 0, (stderr, report)
    assert [(c["name"], c["status"], c["ranks"]) for c in report["checks"]] == [
        (name, "pass", {"0": "pass", "1": "pass"}) for name in ZERO]
    (launch,) = report["launches"]
    assert [(n["host"], n["ranks"], n["launcher"]) for n in launch["nodes"]] == [
        ("mls-node-a", [0], "srun"), ("mls-node-b", [1], "srun")]
    assert launch["argv"][0].endswith("srun")
    sys.stderr.write(f"\n[verify --slurm zero1-3] {time.monotonic() - started:.1f} s in salloc, "
                     f"{report['duration_s']:.1f} s in verify\n")
    assert_nothing_left(slurm)


def test_a_hanging_rank_times_out_and_leaves_nothing_on_either_node(slurm: SlurmCluster,
                                                                    target_venv: TargetVenv) -> None:
    """Rank 1 (node b) hangs in its check; verify gives up at the time-out, and its srun step is gone."""
    env = cli_env(MLSTACK_VERIFY_TEST_FAULT="hang:rank1:environment")
    code, report, stderr = in_allocation(slurm, "verify", "--slurm", "--python", target_venv.python,
                                         "--only", "environment", "--timeout", "60", env=env)
    assert code == ExitCode.VERIFY, stderr
    (check,) = report["checks"]
    assert check["status"] == "fail"
    assert "timed out after 60 s" in check["reason"], check["reason"]
    assert_nothing_left(slurm)


def _hanging_verify(slurm: SlurmCluster, target_venv: TargetVenv, *salloc_options: str) -> subprocess.Popen[str]:
    """`salloc -N2 OPTIONS -- verify --slurm` with rank 1 hanging in its check, started once rank 1 runs on
    node b. verify's own time-out (900 s) is far beyond what the tests wait for, so only they stop it."""
    env = cli_env(MLSTACK_VERIFY_TEST_FAULT="hang:rank1:environment")
    proc = slurm.popen_in(slurm.login, ["salloc", "-N2", "--quiet", *salloc_options, "--",
                                        *cli_argv("verify", "--slurm", "--python", target_venv.python,
                                                  "--only", "environment", "--timeout", "900", "--json")],
                          env=env)
    deadline = time.monotonic() + 300
    while not any(_is_worker(pid) for pid in slurm.processes(slurm.nodes[1])):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no rank started on the second node"
        time.sleep(0.5)
    return proc


def test_sigterm_to_verify_stops_the_ranks_on_both_nodes(slurm: SlurmCluster, target_venv: TargetVenv) -> None:
    proc = _hanging_verify(slurm, target_venv)
    try:
        (cli,) = [pid for pid in slurm.processes(slurm.login) if _is_cli(pid)]
        os.kill(cli, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert json.loads(out)["error"]["message"].startswith("interrupted: verify stopped")
    assert_nothing_left(slurm)


def test_scancel_of_the_job_leaves_nothing_on_either_node(slurm: SlurmCluster, target_venv: TargetVenv) -> None:
    proc = _hanging_verify(slurm, target_venv)
    try:
        (job,) = slurm.squeue()
        cancelled = slurm.run_in(slurm.login, ["scancel", job], timeout=120)
        assert cancelled.returncode == 0, cancelled.stderr
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_left(slurm)


def test_the_jobs_time_limit_leaves_nothing_on_either_node(slurm: SlurmCluster, target_venv: TargetVenv) -> None:
    """A job that reaches its time limit (`salloc --time=1`, one minute) mid-verify: Slurm cancels the ranks'
    step, verify reports why and ends, and neither the CLI, nor a rank, nor a step is left on either node."""
    proc = _hanging_verify(slurm, target_venv, "--time=1")
    try:
        out, err = proc.communicate(timeout=600)  # the limit plus slurmctld's check period and KillWait
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Slurm cancels the step (measured: after 90 s) and verify reports the check failed because of the limit
    # (srun's "CANCELLED ... DUE TO TIME LIMIT" line, or, when srun ended before it came, the job's reason)
    assert proc.returncode == ExitCode.VERIFY, err[-3000:]
    (check,) = json.loads(out)["checks"]
    assert check["status"] == "fail", check
    assert "the job reached its time limit (salloc/sbatch --time)" in check["reason"], check
    assert_nothing_left(slurm)
    assert not [pid for pid in slurm.processes(slurm.login) if _is_cli(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _is_worker(pid: int) -> bool:
    return b"mlstack_verify_worker" in _cmdline(pid)


def _is_cli(pid: int) -> bool:
    """The CLI's own process (salloc's command line names it too)."""
    cmdline = _cmdline(pid)
    return b"mlstack_ds\0verify\0--slurm" in cmdline and not cmdline.startswith(b"salloc")


def test_the_printed_sbatch_script_runs_doctor_and_verify_under_sbatch(slurm: SlurmCluster, target_venv: TargetVenv,
                                                                       tmp_path: Path) -> None:
    """`verify --slurm --print-sbatch` needs no allocation; its script, with the resource lines set for this
    CPU cluster (one rank per node, no GPUs, the nodes' 2 cores), passes under `sbatch --wait`."""
    printed = run_cli("verify", "--slurm", "--print-sbatch", "--python", target_venv.python, "--only", "zero1",
                      base_env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    assert script.startswith("#!/bin/bash\n") and " doctor --slurm --python " in script
    assert script.rstrip().endswith('verify --slurm --python "$PYTHON" --only zero1')
    lines = [line for line in script.splitlines() if not line.startswith("#SBATCH --gpus-per-node")]
    adapted = "\n".join(line.replace("--ntasks-per-node=8", "--ntasks-per-node=1")
                        .replace("--cpus-per-task=4", "--cpus-per-task=1") for line in lines) + "\n"
    job = tmp_path / "job.sh"
    job.write_text(adapted)
    out = tmp_path / "job.out"
    done = slurm.run_in(slurm.login, ["sbatch", "--wait", f"--output={out}", job], env=cli_env(), timeout=1800,
                        cwd=tmp_path)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0, (done.stderr, text[-3000:])
    assert "mls-node-a: reachable; Python" in text and "mls-node-b: reachable; Python" in text  # doctor
    assert "check: zero1; status: pass" in text
    assert "node: mls-node-a; ranks: 0" in text and "node: mls-node-b; ranks: 1" in text
    assert_nothing_left(slurm)

"""Why a rank did not report a check: the reasons the report gives for absent results."""

from __future__ import annotations

from mlstack_ds.launch.launcher import LaunchOutcome
from mlstack_ds.patience import Patience
from mlstack_ds.verify.suite import LaunchBounds, RankLog, _why_missing, launch_bounds


def rank_log(*begun: str, started: bool = True) -> RankLog:
    return RankLog(started, begun, {})


def test_time_out_while_running_the_check() -> None:
    outcome = LaunchOutcome(None, 30.0, True, "")
    assert _why_missing("zero1", rank_log("environment", "zero1"), 0, outcome, 30) == (
        "timed out after 30 s (while running it)")
    assert _why_missing("zero2", rank_log("environment", "zero1"), 0, outcome, 30) == (
        "timed out after 30 s (before reaching it)")


def test_a_launch_stopped_by_the_stall_rule_says_so() -> None:
    outcome = LaunchOutcome(None, 80.0, True, "", stalled=True)
    assert _why_missing("zero1", rank_log("environment", "zero1"), 1, outcome, 45) == (
        "timed out after 45 s with no rank reporting (while running it)")


def test_where_progress_is_watched_the_time_out_is_a_stall_limit_and_per_check() -> None:
    """One node or Slurm: S without a report, and S per check plus S for start-up in all, whatever is left
    of the run (each launch gets its own). Over a hostfile: what is left of S for the whole run."""
    assert launch_bounds(300, 19, -5, watched=True) == LaunchBounds(Patience(6000, 300), 6000)
    assert launch_bounds(45, 1, 45, watched=True) == LaunchBounds(Patience(90, 45), 90)
    assert launch_bounds(300, 19, 120, watched=False) == LaunchBounds(Patience(120), 300)
    assert launch_bounds(300, 3, 0, watched=False).ceiling_s <= 0  # nothing left: not started


def test_the_rank_that_crashed_and_the_rank_the_launcher_stopped() -> None:
    outcome = LaunchOutcome(1, 5.0, False, "boom", {1: 17})
    assert _why_missing("zero1", rank_log("zero1"), 1, outcome, 30) == (
        "rank died during this check (exit code 17)")
    assert _why_missing("zero1", rank_log("zero1"), 0, outcome, 30) == (
        "stopped by the launcher after rank 1 failed (exit code 17)")
    signalled = LaunchOutcome(1, 5.0, False, "boom", {0: -15, 1: 17})
    assert _why_missing("zero1", rank_log("zero1"), 0, signalled, 30) == (
        "stopped by the launcher (signal 15) after rank 1 failed (exit code 17)")


def test_a_rank_that_never_started_quotes_the_launcher() -> None:
    outcome = LaunchOutcome(1, 1.0, False, "Traceback...\nModuleNotFoundError: No module named 'torch'")
    assert _why_missing("zero1", rank_log(started=False), 0, outcome, 30) == (
        "rank never started (launcher exit code 1): ModuleNotFoundError: No module named 'torch'")


def test_not_reached_after_an_early_end() -> None:
    outcome = LaunchOutcome(1, 1.0, False, "")
    assert _why_missing("zero2", rank_log("zero1"), 0, outcome, 30) == (
        "not reached: the launch ended early (launcher exit code 1)")


def test_a_slurm_time_limit_is_named_not_a_dead_rank() -> None:
    """At a job's time limit Slurm terminates every rank: the reason is the limit, not "rank died"."""
    limit = "the job reached its time limit (salloc/sbatch --time): Slurm cancelled the ranks"
    outcome = LaunchOutcome(143, 90.0, False, "srun: error: mls-node-b: task 1: Terminated", {0: -15, 1: -15},
                            ended_by=limit)
    assert _why_missing("zero1", rank_log("zero1"), 1, outcome, 900) == f"{limit} (exit code -15)"


def test_a_lost_node_is_named_not_the_stall_it_caused() -> None:
    """A node lost mid-launch leaves the others waiting until the stall rule stops them: the reason names
    the node (what to look at), not only the time-out."""
    lost = "node mls-node-b is not reachable over ssh: connect to host 10.213.77.2 port 22: Connection timed out"
    outcome = LaunchOutcome(None, 150.0, True, "", stalled=True, ended_by=f"{lost} (lost during the launch)")
    assert _why_missing("zero1", rank_log("zero1"), 0, outcome, 120) == (
        f"{lost} (lost during the launch) (while it ran)")

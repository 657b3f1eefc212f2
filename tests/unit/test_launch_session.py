"""The one launch sequence (launch.session.launch_workers) with real processes: a stand-in for torchrun (a
`torch.distributed.run` module first on PYTHONPATH that starts each rank in a session of its own, as
torchrun does) and a rank module that writes through the staged worker's own protocol."""

from __future__ import annotations

import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

from mlstack_ds.launch import launcher
from mlstack_ds.launch.session import (
    LaunchDirs,
    LaunchInterrupted,
    launch_workers,
    read_records,
    results_progress,
)
from mlstack_ds.patience import Patience

FAKE_TORCHRUN = textwrap.dedent("""\
    import os, subprocess, sys
    args = sys.argv[1:]
    n = int(args[args.index("--nproc-per-node") + 1])
    module = args[args.index("--module") + 1:]
    ranks = [subprocess.Popen([sys.executable, "-m", *module], start_new_session=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(n)}) for r in range(n)]
    sys.exit(max(p.wait() for p in ranks))
""")

RANK = textwrap.dedent("""\
    import os, sys, time
    from mlstack_verify_worker.protocol import ResultLog
    rank = int(os.environ["RANK"])
    log = ResultLog(sys.argv[1], rank)
    log.write({"event": "hello", "rank": rank, "run_id": os.environ["MLSTACK_VERIFY_RUN_ID"]})
    if os.environ.get("FAKE_HANG") == str(rank):
        time.sleep(600)
    for step in range(int(os.environ.get("FAKE_STEPS", "0"))):  # a slow rank that keeps reporting
        time.sleep(1)
        log.write({"event": "start", "check": f"step{step}", "rank": rank})
    log.write({"event": "result", "check": "x", "rank": rank, "status": "pass"})
""")


def fake_torch(tmp_path: Path) -> str:
    package = tmp_path / "fake" / "torch" / "distributed"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(FAKE_TORCHRUN)
    return str(tmp_path / "fake")


def rank_args(seen: list[LaunchDirs]):
    def args(dirs: LaunchDirs) -> list[str]:
        seen.append(dirs)
        (dirs.root / "code" / "fake_rank.py").write_text(RANK)  # the staged code is on the ranks' PYTHONPATH
        return ["fake_rank", str(dirs.results)]
    return args


def test_every_rank_is_read_through_the_protocol_and_the_launch_directory_goes(tmp_path: Path) -> None:
    seen: list[LaunchDirs] = []
    watched: list[str] = []

    @contextmanager
    def watch(results: Path):
        watched.append(f"start {results == seen[0].results}")
        yield
        watched.append("stop")

    launched = launch_workers(Path(sys.executable), rank_args(seen), world_size=2, over=None,
                              patience=Patience(60), extra_env={"PYTHONPATH": fake_torch(tmp_path)}, watch=watch)
    assert launched.outcome.returncode == 0 and not launched.outcome.timed_out
    assert launched.argv[1:3] == ("-m", "torch.distributed.run") and launched.nodes == ()
    assert [[r["event"] for r in launched.records.ranks[rank]] for rank in (0, 1)] == [["hello", "result"]] * 2
    assert launched.records.summary is None
    assert watched == ["start True", "stop"]
    assert not seen[0].root.exists()


def test_a_hung_rank_is_timed_out_swept_and_what_it_wrote_kept(tmp_path: Path) -> None:
    seen: list[LaunchDirs] = []
    launched = launch_workers(Path(sys.executable), rank_args(seen), world_size=2, over=None,
                              patience=Patience(3), extra_env={"PYTHONPATH": fake_torch(tmp_path), "FAKE_HANG": "1"})
    assert launched.outcome.timed_out
    assert [r["event"] for r in launched.records.ranks[1]] == ["hello"]
    assert [r["event"] for r in launched.records.ranks[0]] == ["hello", "result"]
    assert launched.records.ranks[1][0]["run_id"] == seen[0].run_id
    assert launcher.processes_with_marker(seen[0].run_id) == []


def test_a_launch_that_keeps_reporting_outlasts_its_stall_limit(tmp_path: Path) -> None:
    """Issue 28: a healthy launch slowed down by a busy machine is not a hang. Each rank reports every
    second for 16 s, twice the stall limit: it runs to its end."""
    launched = launch_workers(Path(sys.executable), rank_args([]), world_size=2, over=None,
                              patience=Patience(120, 8),
                              extra_env={"PYTHONPATH": fake_torch(tmp_path), "FAKE_STEPS": "16"})
    assert launched.outcome.returncode == 0 and not launched.outcome.timed_out, launched.outcome
    assert launched.outcome.duration_s > 16
    assert [r["event"] for r in launched.records.ranks[1]][-1] == "result"


def test_a_launch_whose_ranks_stop_reporting_is_stopped_at_its_stall_limit(tmp_path: Path) -> None:
    """Rank 1 hangs after its hello: nothing is written any more, so the stall rule (8 s), not the ceiling
    (120 s), ends it; what the ranks wrote is kept and nothing of it is left running."""
    seen: list[LaunchDirs] = []
    launched = launch_workers(Path(sys.executable), rank_args(seen), world_size=2, over=None,
                              patience=Patience(120, 8),
                              extra_env={"PYTHONPATH": fake_torch(tmp_path), "FAKE_HANG": "1"})
    assert launched.outcome.timed_out and launched.outcome.stalled
    assert launched.outcome.duration_s < 60
    assert [r["event"] for r in launched.records.ranks[1]] == ["hello"]
    assert launcher.processes_with_marker(seen[0].run_id) == []


def test_results_progress_changes_with_every_record(tmp_path: Path) -> None:
    assert results_progress(tmp_path / "absent") == ()
    before = results_progress(tmp_path)
    (tmp_path / "rank0.jsonl").write_text('{"event": "hello"}\n')
    after_hello = results_progress(tmp_path)
    with (tmp_path / "rank0.jsonl").open("a") as log:
        log.write('{"event": "start", "check": "zero1"}\n')
    assert len({before, after_hello, results_progress(tmp_path)}) == 3
    assert results_progress(tmp_path) == results_progress(tmp_path)


def test_records_of_ranks_that_wrote_nothing_or_were_cut_off(tmp_path: Path) -> None:
    (tmp_path / "rank0.jsonl").write_text('{"event": "hello"}\n[1]\n{"event": "bench", "sta')
    records = read_records(tmp_path, 2)
    assert records.ranks == {0: [{"event": "hello"}], 1: []} and records.summary is None


def test_an_interrupt_carries_what_the_ranks_wrote() -> None:
    stopped = LaunchInterrupted(read_records(Path("/nonexistent"), 1))
    assert isinstance(stopped, KeyboardInterrupt) and stopped.records.ranks == {0: []}

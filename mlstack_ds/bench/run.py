"""Run a bench: one launch per world size and stage, each bounded in time, leaving nothing running.

The launches are the launch package's (`launch/session.py`: torchrun on one machine, DeepSpeed's launcher
with a hostfile, the run-id marker and the sweep, the worker's result protocol), with the same checks
before them as verify's (`launch/target.py`); the ranks run the worker package's `bench` entry in the
target interpreter. One launch per stage, not one for all: a stage that runs out of memory ends its own
launch (the launcher stops the other ranks) and the next stage starts clean, as the guide's "OOM"
cells mean. Rank 0's progress file is read while a launch runs, so a long stage shows its steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlstack_ds.bench.spec import BenchSpec
from mlstack_ds.cluster import hostfile, slurm
from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.errors import Interrupted
from mlstack_ds.launch import launcher, target, ways
from mlstack_ds.launch.nodes import NodeLaunch
from mlstack_ds.launch.session import RankRecords, launch_workers
from mlstack_ds.patience import Patience, stall_rule
from mlstack_ds.worker.protocol import PROGRESS_FILE

BENCH_MODULE = f"{launcher.WORKER_MODULE}.bench"
PROGRESS_EVERY_S = 2.0
# A stage watched by the stall rule may take this many times `--timeout` in all: its start-up (imports,
# DeepSpeed's initialize), its warm-up and its timed steps may each take up to one `--timeout`.
STAGE_CEILING_TIMEOUTS = 3


@dataclass(frozen=True)
class StageRun:
    """One launch's outcome: `status` ok | oom | failed, with every rank's record (rank -> dict)."""

    world_size: int
    stage: str
    status: str
    reason: str
    ranks: Mapping[int, Mapping[str, Any]]
    duration_s: float
    argv: tuple[str, ...] = ()
    nodes: tuple[Mapping[str, object], ...] = field(default_factory=tuple)


def run_bench(spec: BenchSpec, python: Path, status: Callable[[str], None] = lambda _m: None,
              extra_env: Mapping[str, str] | None = None) -> tuple[list[StageRun], str]:
    """Every (world size, stage) in order; returns the runs and the target's platform (cpu, cuda)."""
    python = resolve_python(python)
    target.refuse_world_size_with_hostfile(spec.world_sizes or None, spec.hostfile)
    slurm.refuse_with_hostfile(spec.slurm, spec.hostfile)
    target.refuse_world_size_with_slurm(spec.world_sizes or None, spec.slurm)
    allocation = slurm.current(os.environ) if spec.slurm else None
    counts = slurm.node_counts(spec.node_counts, allocation) if allocation is not None else ()
    probe = target.require_torch(python)
    hosts = hostfile.parse_hostfile(spec.hostfile) if spec.hostfile else None
    # one launch per (nodes, world size): the hostfile's or the allocation's first N nodes, or this machine
    layouts: list[tuple[int, NodeLaunch | None]]
    if allocation is not None:
        per_node = target.slurm_ranks_per_node(probe, allocation)
        layouts = [(count * per_node, ways.over_nodes(None, allocation.hosts(per_node, count), allocation, os.environ))
                   for count in counts]
    else:
        over = ways.over_nodes(spec.hostfile, hosts, None, os.environ)
        layouts = [(size, over) for size in target.world_sizes(probe, spec.world_sizes or (), spec.hostfile, hosts)]
    platform = "cpu" if probe.gpus == 0 else "gpu"
    runs: list[StageRun] = []
    total = len(layouts) * len(spec.stages)
    for world_size, over_nodes in layouts:
        where = f" over {len(over_nodes.hosts)} node(s)" if allocation is not None and over_nodes else ""
        for stage in spec.stages:
            label = stage_label(stage)
            status(f"[{len(runs) + 1}/{total}] {label} on {world_size} rank(s){where}: {spec.model.name}, "
                   f"{spec.warmup} warm-up + {spec.steps} timed steps")
            try:
                run = _run_stage(python, spec, stage, world_size, over=over_nodes, status=status,
                                 extra_env=extra_env or {})
            except KeyboardInterrupt:
                raise Interrupted(f"interrupted: bench stopped during {label} on {world_size} rank(s); every "
                                  "launched process was killed", hint="run it again (--stages to pick fewer)",
                                  details={"finished": [r.stage for r in runs]}) from None
            status(f"  {label}: {summary_line(run, spec)}")
            runs.append(run)
    return runs, platform


def stage_label(stage: str) -> str:
    return "DDP" if stage == "ddp" else f"ZeRO-{stage}"


def summary_line(run: StageRun, spec: BenchSpec) -> str:
    if run.status != "ok":
        return f"{run.status.upper()}: {run.reason}"
    times = run.ranks[0].get("step_times_s") or []
    samples = run.ranks[0].get("samples_per_step", 0)
    median = sorted(times)[len(times) // 2] if times else 0.0
    rate = samples / median if median else 0.0
    return f"{rate:.2f} samples/s ({run.duration_s:.0f} s)"


def worker_args(spec: BenchSpec, stage: str, out_dir: Path, run_id: str) -> list[str]:
    args = [BENCH_MODULE, "--stage", stage, "--out", str(out_dir), "--layers", str(spec.model.layers),
            "--hidden", str(spec.model.hidden), "--heads", str(spec.model.heads), "--vocab", str(spec.model.vocab),
            "--seq-len", str(spec.seq_len), "--micro-batch", str(spec.micro_batch), "--steps", str(spec.steps),
            "--warmup", str(spec.warmup), "--precision", spec.precision, "--timeout", f"{spec.timeout_s:g}",
            "--run-id", run_id]
    if spec.config_json is not None:
        config_file = out_dir.parent / "ds_config.json"
        config_file.write_text(spec.config_json, encoding="utf-8")
        args += ["--ds-config", str(config_file)]
    if spec.memory_cap:
        args += ["--memory-cap", str(spec.memory_cap)]
    return args


def stage_patience(timeout_s: float) -> Patience:
    """bench's `--timeout` as a Patience, verify's rule: a stage is stopped after `timeout_s` with no rank
    reporting (rank 0's progress lines, every rank's result), and one that keeps reporting gets up to
    STAGE_CEILING_TIMEOUTS times that. Where the ranks' files are not seen while they run (a node with a
    copy of the launch directory), `timeout_s` alone bounds the stage, as before."""
    return stall_rule(timeout_s, timeout_s * STAGE_CEILING_TIMEOUTS)


def _run_stage(python: Path, spec: BenchSpec, stage: str, world_size: int, *, over: NodeLaunch | None,
               status: Callable[[str], None], extra_env: Mapping[str, str]) -> StageRun:
    patience = stage_patience(spec.timeout_s)
    launched = launch_workers(
        python, lambda dirs: worker_args(spec, stage, dirs.results, dirs.run_id), world_size=world_size,
        over=over, patience=patience, unwatched=Patience(ceiling_s=spec.timeout_s), extra_env=extra_env,
        status=status, prefix="mlstack-bench-",
        watch=lambda results: ProgressWatcher(results / PROGRESS_FILE, stage, status))
    ranks = read_ranks(launched.records)
    verdict, reason = judge(ranks, world_size, launched.outcome, spec.timeout_s,
                            ceiling_s=patience.ceiling_s if launched.watched else spec.timeout_s)
    return StageRun(world_size, stage, verdict, reason, ranks, round(launched.outcome.duration_s, 3), launched.argv,
                    tuple(n.to_json() for n in launched.nodes))


def read_ranks(records: RankRecords) -> dict[int, dict[str, Any]]:
    """Each rank's `bench` record (its last one); a rank that wrote none is missing."""
    ranks: dict[int, dict[str, Any]] = {}
    for rank, written in records.ranks.items():
        found = [r for r in written if r.get("event") == "bench"]
        if found:
            ranks[rank] = dict(found[-1])
    return ranks


def judge(ranks: Mapping[int, Mapping[str, Any]], world_size: int, outcome: launcher.LaunchOutcome,
          timeout_s: float, *, ceiling_s: float | None = None) -> tuple[str, str]:
    """ok when every rank finished; oom when any rank ran out of memory (the launcher then stops the
    others, which write nothing); failed otherwise, with the first reason a rank gave or the launch's.
    `timeout_s`: `--timeout` (the stall rule's time); `ceiling_s`: the stage's whole bound (default the same)."""
    ooms = [(rank, record) for rank, record in sorted(ranks.items()) if record.get("status") == "oom"]
    if ooms:
        rank, record = ooms[0]
        return "oom", f"rank {rank} ran out of memory at {record.get('phase', '?')}: {record.get('reason', '')}"
    problems = [(rank, record) for rank, record in sorted(ranks.items()) if record.get("status") != "ok"]
    if problems:
        rank, record = problems[0]
        what = "needs a JIT compile (prebuilt ops only)" if record.get("status") == "jit" else "failed"
        return "failed", f"rank {rank} {what} at {record.get('phase', '?')}: {record.get('reason', '')}"
    if outcome.timed_out and outcome.stalled:
        return "failed", f"timed out: no rank reported for {timeout_s:g} s (a hang; --timeout)"
    if outcome.timed_out:
        return "failed", f"timed out after {ceiling_s if ceiling_s is not None else timeout_s:g} s"
    if outcome.ended_by:
        return "failed", outcome.ended_by
    missing = [rank for rank in range(world_size) if rank not in ranks]
    if missing:
        tail = outcome.log_tail.strip().splitlines()[-1:] if outcome.log_tail.strip() else []
        return "failed", (f"rank(s) {', '.join(map(str, missing))} reported nothing (launcher exit code "
                          f"{outcome.returncode}){': ' + tail[0] if tail else ''}")
    return "ok", ""


class ProgressWatcher:
    """Reads rank 0's progress lines while the launch runs; one status line per step, at most every
    PROGRESS_EVERY_S seconds (the last step always shown)."""

    def __init__(self, path: Path, stage: str, status: Callable[[str], None]) -> None:
        self.path = path
        self.label = stage_label(stage)
        self.status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-progress", daemon=True)
        self._offset = 0
        self._last_shown = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProgressWatcher:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._read()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            with self.path.open(encoding="utf-8") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
            complete, _, _ = chunk.rpartition("\n")
            if not complete:
                return
            self._offset += len(complete.encode()) + 1
            lines = [json.loads(line) for line in complete.splitlines() if line.strip()]
            steps = [line for line in lines if line.get("phase") in ("warm-up", "timed")]
            now = time.monotonic()
            if steps and (now - self._last_shown >= PROGRESS_EVERY_S or steps[-1]["step"] == steps[-1]["of"]):
                last = steps[-1]
                self._last_shown = now
                self.status(f"  {self.label}: step {last['step']}/{last['of']} ({last['phase']}), "
                            f"{last['elapsed_s']:.0f} s")

"""Run the verify suite against a target interpreter and produce a `VerifyReport`.

One launch per group of checks (by default a single launch for the whole suite), and a check that did
not report is a failure whose reason says why (time-out, a rank that died, a launcher that never started
the ranks).

The time-out S is a stall rule where the ranks' progress can be seen while they run (one node, Slurm): a
launch is stopped when no rank has reported anything for S s, and after S s per check (plus S for
start-up) at most. A report is any line of a rank's file: its milestones, each training step, and
`working` while an import computes (worker/protocol.py), so a slow rank keeps reporting and a stuck one
does not. A hang stops reporting, so it still ends S s after the last report; a machine busy with
other work only slows the checks down. (A fixed 300 s for the whole suite is, by its timing, what failed
all 19 checks of a healthy install, 76 s on a quiet machine, on one running three parallel builds.) Over a
hostfile the same holds where every node shares the launch directory (a node ten times slower than the
others, measured, takes longer than S in all and never S without a report); where a node has a copy, its
ranks' files come back only at the end, so there S bounds the whole run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.cluster import hostfile, slurm
from mlstack_ds.detect.client_pairs import known_bad_pairs
from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.errors import Interrupted, UsageError
from mlstack_ds.launch import launcher, target, ways
from mlstack_ds.launch.nodes import NodeLaunch
from mlstack_ds.launch.session import LaunchDirs, LaunchInterrupted, RankRecords, launch_workers
from mlstack_ds.patience import VERIFY_TIMEOUT_S, Patience, stall_rule
from mlstack_ds.verify.checks import CheckSpec, launch_groups, select_checks
from mlstack_ds.verify.report import CheckResult, LaunchRecord, VerifyReport, merge_check, with_known_cause

CONFIG_CHECK = "config"  # opt-in: runs with `--config FILE` (and only it, unless --only names more)


@dataclass(frozen=True)
class VerifyOptions:
    python: Path
    world_size: int | None = None
    only: str | None = None
    skip: str | None = None
    timeout_s: float = VERIFY_TIMEOUT_S
    hostfile: Path | None = None
    isolate: bool = False
    extra_env: Mapping[str, str] | None = None  # e.g. the test-only fault injection variable
    receipt: Path | None = None  # default: the worker reads <target sys.prefix>/share/mlstack-ds/receipt.json
    target: TargetFacts | None = None  # the caller's probe of `python` with torch's facts (install's detect)
    ds_config: Mapping[str, object] | None = None  # `--config`: the user's config, already parsed by DeepSpeed
    slurm: bool = False  # `--slurm`: the nodes of the Slurm allocation this runs in, ranks started by srun


def run_verify(options: VerifyOptions, status: Callable[[str], None] = lambda _m: None) -> VerifyReport:
    started = time.monotonic()
    python = resolve_python(options.python)
    if not math.isfinite(options.timeout_s) or options.timeout_s <= 0:
        raise UsageError(f"--timeout {options.timeout_s:g}: must be a positive number of seconds", hint="e.g. 300")
    if options.world_size is not None and options.world_size < 1:
        raise UsageError(f"--world-size {options.world_size}: must be at least 1", hint="e.g. 2")
    target.refuse_world_size_with_hostfile(options.world_size, options.hostfile)
    slurm.refuse_with_hostfile(options.slurm, options.hostfile)
    target.refuse_world_size_with_slurm(options.world_size, options.slurm)
    allocation = slurm.current(os.environ) if options.slurm else None
    specs = select_checks(options.only if options.only or options.ds_config is None else CONFIG_CHECK, options.skip)
    if any(s.name == CONFIG_CHECK for s in specs) and options.ds_config is None:
        raise UsageError(f"the {CONFIG_CHECK} check needs --config FILE", hint="e.g. verify --config ds_config.json")
    if options.ds_config is not None and all(s.name != CONFIG_CHECK for s in specs):
        specs = (*specs, *select_checks(CONFIG_CHECK))
    hosts = hostfile.parse_hostfile(options.hostfile) if options.hostfile else None

    probe = target.require_torch(python, options.target)
    if allocation is not None:
        hosts = allocation.hosts(target.slurm_ranks_per_node(probe, allocation))
        world_size = sum(h.slots for h in hosts)
        status(f"Slurm job {allocation.job_id}: {len(hosts)} node(s) ({', '.join(h.host for h in hosts)}), "
               f"{hosts[0].slots} rank(s) each")
    else:
        (world_size,) = target.world_sizes(probe, (options.world_size,) if options.world_size else (),
                                           options.hostfile, hosts)
    over = ways.over_nodes(options.hostfile, hosts, allocation, os.environ)
    watched = True  # until a launch finds it cannot see the ranks' progress (launch.session.progress_visible)
    deadline = started + options.timeout_s  # the whole run's, where progress is not watched
    results: list[CheckResult] = []
    launches: list[LaunchRecord] = []
    for group in launch_groups(specs, options.isolate):
        remaining_s = deadline - time.monotonic()
        bounds = launch_bounds(options.timeout_s, len(group), remaining_s, watched=watched)
        if bounds.ceiling_s <= 0:
            reason = f"timed out after {options.timeout_s:g} s (not started)"
            results += [CheckResult(s.name, "fail", reason, 0.0) for s in group]
            continue
        status(f"launching {len(group)} check(s) on {world_size} rank(s): {', '.join(s.name for s in group)}")
        try:
            group_results, record, watched = _run_group(python, group, world_size, over=over, options=options,
                                                        bounds=bounds, unwatched_s=remaining_s, status=status)
        except _InterruptedGroup as stopped:
            done = results + stopped.finished
            raise Interrupted(
                f"interrupted: verify stopped after {len(done)} finished check(s); every launched process "
                "was killed", hint="run it again (or --only the checks you need)",
                details={"checks": [asdict(r) for r in done]}) from None
        results += group_results
        launches.append(record)
    pairs = known_bad_pairs()
    return VerifyReport(str(python), world_size, tuple(with_known_cause(r, pairs) for r in results), tuple(launches),
                        time.monotonic() - started, clients=dict(probe.clients))


@dataclass(frozen=True)
class LaunchBounds:
    """How long one launch of checks may run (`patience`: `ceiling_s` in all and, with `stall_s`, that long
    without any rank reporting); `named_s` is the time a timed-out check's reason names when the ceiling
    stopped it."""

    patience: Patience
    named_s: float

    @property
    def ceiling_s(self) -> float:
        return self.patience.ceiling_s

    @property
    def stall_s(self) -> float | None:
        return self.patience.stall_s


def launch_bounds(timeout_s: float, checks: int, remaining_s: float, *, watched: bool) -> LaunchBounds:
    """The module docstring's rule, the one place verify's `--timeout` becomes a Patience: watched,
    `timeout_s` without a report and `timeout_s` per check plus one for start-up in all; not watched, what is
    left of the whole run's `timeout_s` (a fixed bound; nothing, when that is used up)."""
    if watched:
        ceiling = timeout_s * (checks + 1)
        return LaunchBounds(stall_rule(timeout_s, ceiling), ceiling)
    return LaunchBounds(Patience(ceiling_s=max(0.0, remaining_s)), timeout_s)


def _run_group(python: Path, group: Sequence[CheckSpec], world_size: int, *, over: NodeLaunch | None,
               options: VerifyOptions, bounds: LaunchBounds, unwatched_s: float, status: Callable[[str], None],
               ) -> tuple[list[CheckResult], LaunchRecord, bool]:
    """The group's results, its launch record, and whether the stall rule applied (`unwatched_s`, what is
    left of the whole run's time-out, bounds a launch whose progress cannot be seen here)."""
    names = [s.name for s in group]

    def worker_args(dirs: LaunchDirs) -> list[str]:
        ds_config = None
        if options.ds_config is not None:
            ds_config = dirs.root / "ds_config.json"  # inside the launch directory: copied to nodes that need it
            ds_config.write_text(json.dumps(options.ds_config), encoding="utf-8")
        return launcher.worker_args(names, dirs.results, options.timeout_s, dirs.run_id, options.receipt,
                                    ds_config=ds_config)

    try:
        launched = launch_workers(python, worker_args, world_size=world_size, over=over,
                                  patience=bounds.patience, extra_env=options.extra_env, status=status,
                                  prefix="mlstack-verify-", unwatched=Patience(ceiling_s=max(0.0, unwatched_s)))
    except LaunchInterrupted as stopped:  # keep the checks every rank had finished
        logs = rank_logs(stopped.records, world_size)
        finished = [merge_check(name, {rank: log.results[name] for rank, log in logs.items()}, world_size, {})
                    for name in names if all(name in log.results for log in logs.values())]
        raise _InterruptedGroup(finished) from None
    outcome = launched.outcome
    logs = rank_logs(launched.records, world_size)
    named_s = bounds.named_s if launched.watched else options.timeout_s
    if outcome.stalled and bounds.stall_s is not None:
        named_s = bounds.stall_s
    results = []
    for name in names:
        per_rank = {rank: log.results[name] for rank, log in logs.items() if name in log.results}
        missing = {rank: _why_missing(name, log, rank, outcome, named_s)
                   for rank, log in logs.items() if name not in log.results}
        results.append(merge_check(name, per_rank, world_size, missing))
    record = LaunchRecord(launched.argv, tuple(names), outcome.returncode, round(outcome.duration_s, 3),
                          outcome.timed_out, outcome.log_tail if _any_failed(results) else "",
                          tuple(n.to_json() for n in launched.nodes))
    return results, record, launched.watched


@dataclass(frozen=True)
class RankLog:
    """What one rank wrote: whether it started, the checks it began, its results by check."""

    started: bool
    begun: tuple[str, ...]
    results: Mapping[str, Mapping[str, Any]]


def rank_logs(records: RankRecords, world_size: int) -> dict[int, RankLog]:
    """Each rank's check events, overlaid by rank 0's gathered summary (which covers remote nodes)."""
    logs: dict[int, RankLog] = {}
    for rank in range(world_size):
        started, begun, results = False, [], {}
        for record in records.ranks.get(rank, ()):
            event = record.get("event")
            started = started or event == "hello"
            if event == "start" and "check" in record:
                begun.append(record["check"])
            elif event == "result" and "check" in record:
                results[record["check"]] = record
        logs[rank] = RankLog(started, tuple(begun), results)
    with contextlib.suppress(ValueError):  # a summary of another shape: the ranks' own files stand
        for rank_text, gathered in (records.summary or {}).get("ranks", {}).items():
            rank = int(rank_text)
            if rank < world_size and not logs[rank].results:
                by_check = {r["check"]: r for r in gathered}
                logs[rank] = RankLog(True, tuple(by_check), by_check)
    return logs


class _InterruptedGroup(Exception):
    """A launch stopped by Ctrl-C/SIGTERM, carrying the checks every rank had finished."""

    def __init__(self, finished: list[CheckResult]) -> None:
        super().__init__("interrupted")
        self.finished = finished


def _any_failed(results: Sequence[CheckResult]) -> bool:
    return any(r.status == "fail" for r in results)


def _why_missing(name: str, log: RankLog, rank: int, outcome: launcher.LaunchOutcome,
                 timeout_s: float) -> str:
    code = outcome.rank_exit_codes.get(rank)
    if outcome.ended_by:  # before the time-out: a lost node is why the others stopped reporting
        return f"{outcome.ended_by} ({f'exit code {code}' if code is not None else 'while it ran'})"
    if outcome.timed_out:
        where = "while running it" if log.begun and log.begun[-1] == name else "before reaching it"
        how = " with no rank reporting" if outcome.stalled else ""
        return f"timed out after {timeout_s:g} s{how} ({where})"
    culprits = sorted((r, c) for r, c in outcome.rank_exit_codes.items() if r != rank and c > 0)
    if culprits and (code is None or code < 0):
        culprit, culprit_code = culprits[0]
        how = f" (signal {-code})" if code is not None else ""
        return f"stopped by the launcher{how} after rank {culprit} failed (exit code {culprit_code})"
    exit_text = f"exit code {code}" if code is not None else f"launcher exit code {outcome.returncode}"
    if not log.started:
        last = outcome.log_tail.strip().splitlines()[-1:] if outcome.log_tail.strip() else []
        return f"rank never started ({exit_text}){': ' + last[0] if last else ''}"
    if log.begun and log.begun[-1] == name:
        return f"rank died during this check ({exit_text})"
    return f"not reached: the launch ended early ({exit_text})"

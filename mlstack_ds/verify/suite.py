"""Run the verify suite against a target interpreter and produce a `VerifyReport`.

One launch per group of checks (by default a single launch for the whole suite); the time-out bounds
the whole run, and a check that did not report is a failure whose reason says why (time-out, a rank
that died, a launcher that never started the ranks).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mlstack_ds.cluster import hostfile
from mlstack_ds.detect import target_probe
from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.errors import EnvironmentProblem, Interrupted, UsageError
from mlstack_ds.launch import launcher, nodes
from mlstack_ds.verify.checks import CheckSpec, launch_groups, select_checks
from mlstack_ds.verify.report import CheckResult, LaunchRecord, VerifyReport, merge_check

DEFAULT_TIMEOUT_S = 300.0
CONFIG_CHECK = "config"  # opt-in: runs with `--config FILE` (and only it, unless --only names more)
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class VerifyOptions:
    python: Path
    world_size: int | None = None
    only: str | None = None
    skip: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    hostfile: Path | None = None
    isolate: bool = False
    extra_env: Mapping[str, str] | None = None  # e.g. the test-only fault injection variable
    receipt: Path | None = None  # default: the worker reads <target sys.prefix>/share/mlstack-ds/receipt.json
    target: TargetFacts | None = None  # the caller's probe of `python` with torch's facts (install's detect)
    ds_config: Mapping[str, object] | None = None  # `--config`: the user's config, already parsed by DeepSpeed


@dataclass(frozen=True)
class TargetProbe:
    torch_version: str | None
    gpus: int
    error: str


def probe_target(python: Path, known: TargetFacts | None = None) -> TargetProbe:
    """Is torch importable in `python`, and how many GPUs does it see? From `known` when the caller
    already asked this interpreter with torch's part (install: detect's probe), else from a new probe."""
    facts = known if known is not None and known.torch_probed else target_probe.probe_target(
        python, timeout=PROBE_TIMEOUT_S)
    if facts.torch is None:
        return TargetProbe(None, 0, facts.torch_error or facts.problem or "")
    return TargetProbe(facts.torch.version, facts.torch.device_count, "")


def run_verify(options: VerifyOptions, status: Callable[[str], None] = lambda _m: None) -> VerifyReport:
    started = time.monotonic()
    python = resolve_python(options.python)
    if not math.isfinite(options.timeout_s) or options.timeout_s <= 0:
        raise UsageError(f"--timeout {options.timeout_s:g}: must be a positive number of seconds", hint="e.g. 300")
    if options.world_size is not None and options.world_size < 1:
        raise UsageError(f"--world-size {options.world_size}: must be at least 1", hint="e.g. 2")
    if options.hostfile is not None and options.world_size is not None:
        raise UsageError("--world-size cannot be combined with --hostfile",
                         hint="the hostfile's slots=N entries decide how many ranks run on each node")
    specs = select_checks(options.only if options.only or options.ds_config is None else CONFIG_CHECK, options.skip)
    if any(s.name == CONFIG_CHECK for s in specs) and options.ds_config is None:
        raise UsageError(f"the {CONFIG_CHECK} check needs --config FILE", hint="e.g. verify --config ds_config.json")
    if options.ds_config is not None and all(s.name != CONFIG_CHECK for s in specs):
        specs = (*specs, *select_checks(CONFIG_CHECK))
    hosts = hostfile.parse_hostfile(options.hostfile) if options.hostfile else None

    probe = probe_target(python, options.target)
    if probe.torch_version is None:  # nothing can be checked: the environment is the problem, not a check
        raise EnvironmentProblem(f"torch is not importable in {python}: {probe.error or 'not installed'}",
                                 hint="install PyTorch there (and DeepSpeed with `mlstack-ds install`), "
                                 "or point --python at the environment that has them")

    if hosts is not None and options.hostfile is not None:
        world_size = hostfile.hostfile_world_size(options.hostfile, hosts)
    else:
        world_size = options.world_size or (probe.gpus if probe.gpus > 0 else 2)
    deadline = started + options.timeout_s
    results: list[CheckResult] = []
    launches: list[LaunchRecord] = []
    for group in launch_groups(specs, options.isolate):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = f"timed out after {options.timeout_s:g} s (not started)"
            results += [CheckResult(s.name, "fail", reason, 0.0) for s in group]
            continue
        status(f"launching {len(group)} check(s) on {world_size} rank(s): {', '.join(s.name for s in group)}")
        try:
            group_results, record = _run_group(python, group, world_size, hosts=hosts, options=options,
                                               timeout_s=remaining, status=status)
        except _InterruptedGroup as stopped:
            done = results + stopped.finished
            raise Interrupted(
                f"interrupted: verify stopped after {len(done)} finished check(s); every launched process "
                "was killed", hint="run it again (or --only the checks you need)",
                details={"checks": [asdict(r) for r in done]}) from None
        results += group_results
        launches.append(record)
    return VerifyReport(str(python), world_size, tuple(results), tuple(launches), time.monotonic() - started)


def _run_group(python: Path, group: Sequence[CheckSpec], world_size: int, *,
               hosts: Sequence[hostfile.HostEntry] | None, options: VerifyOptions, timeout_s: float,
               status: Callable[[str], None]) -> tuple[list[CheckResult], LaunchRecord]:
    names = [s.name for s in group]
    run_id = launcher.new_run_id()
    with tempfile.TemporaryDirectory(prefix="mlstack-verify-") as tmp:
        launch_dir = Path(tmp)
        out_dir = launch_dir / "results"
        out_dir.mkdir()
        staged = launcher.stage_worker(launch_dir / "code")
        ds_config = None
        if options.ds_config is not None:
            ds_config = launch_dir / "ds_config.json"  # inside launch_dir: copied to nodes that need it
            ds_config.write_text(json.dumps(options.ds_config), encoding="utf-8")
        args = launcher.worker_args(names, out_dir, options.timeout_s, run_id, options.receipt,
                                  ds_config=ds_config)
        env = launcher.worker_env({**os.environ, **(options.extra_env or {})}, staged)
        argv, node_list = nodes.launch_command(python, args, env, launch_dir=launch_dir, run_id=run_id,
                                               world_size=world_size, hosts=hosts, hostfile=options.hostfile,
                                               status=status)
        try:
            # the working directory exists on every node: DeepSpeed's launcher `cd`s to it there
            outcome = launcher.run_launch(argv, timeout_s=timeout_s, run_id=run_id, env=env, cwd=staged)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the launch is already killed; keep what finished
            nodes.finish(node_list, run_id, launch_dir, out_dir, env=env)
            logs = launcher.read_rank_logs(out_dir, world_size)
            finished = [merge_check(name, {rank: log.results[name] for rank, log in logs.items()}, world_size, {})
                        for name in names if all(name in log.results for log in logs.values())]
            raise _InterruptedGroup(finished) from None
        nodes.finish(node_list, run_id, launch_dir, out_dir, env=env)
        logs = launcher.read_rank_logs(out_dir, world_size)
    results = []
    for name in names:
        per_rank = {rank: log.results[name] for rank, log in logs.items() if name in log.results}
        missing = {rank: _why_missing(name, log, rank, outcome, options.timeout_s)
                   for rank, log in logs.items() if name not in log.results}
        results.append(merge_check(name, per_rank, world_size, missing))
    record = LaunchRecord(tuple(argv), tuple(names), outcome.returncode, round(outcome.duration_s, 3),
                          outcome.timed_out, outcome.log_tail if _any_failed(results) else "",
                          tuple(n.to_json() for n in node_list))
    return results, record


class _InterruptedGroup(Exception):
    """A launch stopped by Ctrl-C/SIGTERM, carrying the checks every rank had finished."""

    def __init__(self, finished: list[CheckResult]) -> None:
        super().__init__("interrupted")
        self.finished = finished


def _any_failed(results: Sequence[CheckResult]) -> bool:
    return any(r.status == "fail" for r in results)


def _why_missing(name: str, log: launcher.RankLog, rank: int, outcome: launcher.LaunchOutcome,
                 timeout_s: float) -> str:
    if outcome.timed_out:
        where = "while running it" if log.begun and log.begun[-1] == name else "before reaching it"
        return f"timed out after {timeout_s:g} s ({where})"
    code = outcome.rank_exit_codes.get(rank)
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

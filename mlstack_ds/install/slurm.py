"""`install --slurm`: `install --hostfile`'s sequence (install/nodes.py) on a Slurm allocation's nodes, through
srun instead of ssh.

1. every node runs this tool's `detect --json` in one srun step (one task per node): platform, GPU targets,
   the target environment's prefix; a node where the tool or the interpreter is missing is named;
2. the targets are the union of the nodes' (`--arch` overrides); the wheel is built (or found) here, once
   (a login node without GPUs builds for the nodes' targets);
3. one more step asks every node which of two files this host just wrote it sees: one in the cache entry
   (the cache must be shared: srun copies no directories), one in the target environment (nodes that see
   it share this host's environment, which is then installed once, by the first of them; the others have
   node-local environments, each installed on its own node);
4. each group's node runs `mlstack-ds install --cached-wheel KEY` as an srun task of one node; the first
   failure rolls back what this run installed (`mlstack-ds rollback` there), all or nothing;
5. `verify --slurm` across the allocation.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlstack_ds.build.wheel import BuildProgress
from mlstack_ds.cluster import slurm
from mlstack_ds.cluster import srun_steps as srun
from mlstack_ds.cluster.tool import SAME_PATH_HINT, ToolRun, tool_argv
from mlstack_ds.console import Output
from mlstack_ds.errors import EnvironmentProblem, MlstackError, ToolTimedOut, UsageError
from mlstack_ds.install.nodes import (
    DETECT_TIMEOUT_S,
    INSTALL_TIMEOUT_S,
    ROLLBACK_TIMEOUT_S,
    HostfileOutcome,
    NodeFacts,
    NodeGroup,
    NodeOps,
    NodeResult,
    args_for_nodes,
    check_bundle_on_nodes,
    gpu_archs,
    install_groups,
    plan_for_nodes,
    wheel_for_nodes,
)
from mlstack_ds.install.pipeline import InstallRequest
from mlstack_ds.verify.suite import VerifyOptions, run_verify

PROBE_NAME = ".mlstack-ds-slurm-probe-"


def run_slurm_install(request: InstallRequest, output: Output, progress: BuildProgress | None = None, *,
                      dry_run: bool = False, env: Mapping[str, str] | None = None) -> HostfileOutcome:
    """Check every allocated node, build here, install on each node (or once, shared), roll back on the first
    failure, verify across the allocation."""
    environ = dict(os.environ if env is None else env)
    allocation = slurm.current(environ)
    if request.python is None:
        raise UsageError("install --slurm needs the target interpreter's path", hint="pass --python PATH")
    python = request.python
    hosts = list(allocation.nodes)
    output.status(f"Slurm job {allocation.job_id}: {len(hosts)} node(s) ({', '.join(hosts)})")
    results = {host: NodeResult(host) for host in hosts}
    facts = detect_nodes(allocation, python, environ)
    for found in facts:
        results[found.host].action = "checked"
        output.status(f"{found.host}: ready ({found.platform}"
                      + (f", GPU targets {','.join(found.archs)})" if found.archs else ")"))
    plan = plan_for_nodes(request, facts)
    cache_root, index, node_args = args_for_nodes(plan, python, output, dry_run=dry_run)
    if request.offline is not None:  # one srun step per node, one after the other: steps may not overlap
        check_bundle_on_nodes(request.offline, hosts, results, output, parallel=False, dry_run=lambda host: run_tool_on(
            allocation, host, [*node_args, "--dry-run"], timeout_s=DETECT_TIMEOUT_S, env=environ))
    if dry_run:
        return HostfileOutcome(plan.plan, None, tuple(results.values()))
    wheel = wheel_for_nodes(plan, index, output, progress)
    (cache_root / "tmp").mkdir(parents=True, exist_ok=True)
    groups = group_nodes(allocation, facts, wheel.parent if wheel else cache_root / "tmp", Path(facts[0].prefix),
                         env=environ, output=output, need_cache=wheel is not None)

    def install(group: NodeGroup) -> ToolRun:
        return run_tool_on(allocation, group.leader.host, node_args, timeout_s=INSTALL_TIMEOUT_S, env=environ)

    def rollback(host: str, target: Path) -> str | None:
        try:
            run = run_tool_on(allocation, host, ["rollback", "--python", str(target)], timeout_s=ROLLBACK_TIMEOUT_S,
                              env=environ)
        except MlstackError as exc:
            return exc.message
        return None if run.ok else run.error_message()

    install_groups(groups, results, ops=NodeOps(cache=lambda _host: "shared" if wheel else "index", install=install,
                                                rollback=rollback), python=python, output=output)
    report = None
    if request.verify:
        output.status(f"verifying across the {len(hosts)} node(s) (mlstack-ds verify --slurm)")
        report = run_verify(VerifyOptions(python=python, slurm=True), status=output.status)
    return HostfileOutcome(plan.plan, wheel, tuple(results.values()), report)


def detect_nodes(allocation: slurm.Allocation, python: Path, env: Mapping[str, str]) -> list[NodeFacts]:
    """This tool's `detect --json --python PYTHON` on every node in one srun step; EnvironmentProblem naming
    every node that did not answer with a document (the tool or the interpreter missing there)."""
    hosts = list(allocation.nodes)
    try:
        answers, result = srun.on_each_node(allocation, hosts, tool_argv(["detect", "--python", python, "--json"]),
                                            timeout_s=DETECT_TIMEOUT_S, env=env)
    except ToolTimedOut as exc:
        raise EnvironmentProblem(f"mlstack-ds detect did not finish on every node within {DETECT_TIMEOUT_S:g} s",
                                 hint=f"is the allocation still running (`squeue -j {allocation.job_id}`)?") from exc
    facts, problems = [], []
    for host in hosts:
        document = _document(answers.get(host, ""))
        if document is None or "platform" not in document:
            why = (document or {}).get("error", {}).get("message") if document else None
            problems.append(f"node {host}: mlstack-ds detect failed: {why or _last_line(result.stderr)}")
            continue
        prefix = str((document.get("python") or {}).get("prefix") or "")
        facts.append(NodeFacts(host, str(document["platform"]), gpu_archs(document.get("gpus") or []), prefix))
    if problems:
        raise EnvironmentProblem(problems[0] if len(problems) == 1 else
                                 f"{len(problems)} nodes cannot take part: {'; '.join(problems)}",
                                 hint=f"{SAME_PATH_HINT}; create --python's environment at the same path on every "
                                 "node (node-local or shared)")
    return facts


def group_nodes(allocation: slurm.Allocation, facts: Sequence[NodeFacts], cache_entry: Path, prefix: Path, *,
                env: Mapping[str, str], output: Output, need_cache: bool = True) -> list[NodeGroup]:
    """Which nodes see this host's cache entry (all must, unless they install from an index: `need_cache`)
    and its target environment (those form one group, installed once); the others are groups of one
    (node-local environments)."""
    token = secrets.token_hex(8)
    cache_probe, env_probe = cache_entry / f"{PROBE_NAME}{token}", prefix / f"{PROBE_NAME}{token}"
    written = []
    try:
        for probe in (cache_probe, env_probe):
            try:
                probe.write_text(token)
                written.append(probe)
            except OSError:
                continue  # this host cannot write there: no node is taken to share it
        answers, _result = srun.on_each_node(allocation, [f.host for f in facts],
                                             ["ls", "-d", "--", cache_probe, env_probe], timeout_s=srun.CHECK_TIMEOUT_S,
                                             env=env)
    finally:
        for probe in written:
            probe.unlink(missing_ok=True)
    blind = [f.host for f in facts if str(cache_probe) not in answers.get(f.host, "").splitlines()]
    if blind and need_cache:
        raise EnvironmentProblem(f"node(s) {', '.join(blind)} do not see the wheel cache {cache_entry.parent.parent}",
                                 hint="install --slurm installs the wheel from the cache: give --cache-dir on a file "
                                 "system every node sees (e.g. under $HOME)")
    shared = [f for f in facts if str(env_probe) in answers.get(f.host, "").splitlines()]
    groups: list[NodeGroup] = []
    if shared:
        groups.append(NodeGroup(shared[0], None, [f.host for f in shared[1:]]))
        for member in shared[1:]:
            output.status(f"{member.host}: shares the target environment with {shared[0].host}")
    groups += [NodeGroup(f, None) for f in facts if f not in shared]
    order = [f.host for f in facts]
    return sorted(groups, key=lambda g: order.index(g.leader.host))


def run_tool_on(allocation: slurm.Allocation, host: str, args: Sequence[str | Path], *, timeout_s: float,
                env: Mapping[str, str]) -> ToolRun:
    """`mlstack-ds ARGS --json` as one srun task on `host`."""
    try:
        result = srun.on_node(allocation, host, tool_argv([*args, "--json"]), timeout_s=timeout_s, env=env)
    except ToolTimedOut as exc:
        raise EnvironmentProblem(f"node {host}: mlstack-ds {args[0]} did not finish within {timeout_s:g} s",
                                 hint="see what the node is doing; nothing else waits for it") from exc
    document = _document(result.stdout)
    return ToolRun(result.returncode, document, result.stderr)


def _document(text: str) -> dict | None:
    try:
        document = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no answer"

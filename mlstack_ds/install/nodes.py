"""`install --hostfile`: build the wheel once here, install that same wheel on every node, all or nothing.

Why this shape (docs/multinode.md): a multi-node job needs the same DeepSpeed build everywhere,
and compiling on every node would take as long per node as here and could give different builds. So:

1. every node is checked before anything happens (reachable, the target interpreter and this very tool
   at the same paths, its platform and GPU targets from the tool's own `detect` run there);
2. the targets are the union of the nodes' GPU archs (`--arch` overrides), one wavefront size;
3. the wheel is built (or found in the cache) here, once;
4. each node installs it by running `mlstack-ds install --cached-wheel KEY` there, which refuses to
   build: a node whose plan differs fails naming the difference. A node that does not see this host's
   cache gets the cache entry copied to the same path first; nodes that share the target environment
   (a venv on a shared file system) are installed once, by the first of them;
5. the first node that fails stops the run, and the nodes this run installed are rolled back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlstack_ds import gfx, runner
from mlstack_ds.build.wheel import BuildProgress
from mlstack_ds.bundle.offline import NOTHING_INSTALLED
from mlstack_ds.cluster import remote
from mlstack_ds.cluster.fanout import on_each
from mlstack_ds.cluster.hostfile import HostEntry, parse_hostfile
from mlstack_ds.cluster.tool import ToolRun, check_tool, run_tool
from mlstack_ds.console import Output
from mlstack_ds.errors import EnvironmentProblem, ExitCode, InstallError, MlstackError, UsageError
from mlstack_ds.install.pipeline import InstallRequest, Prepared, prepare, run_build
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.source.cache import Cache, default_cache_dir, sha256_of
from mlstack_ds.verify.report import VerifyReport
from mlstack_ds.verify.suite import VerifyOptions, run_verify

DETECT_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 3600.0  # pip on the node: DeepSpeed's requirements, then the wheel
ROLLBACK_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class NodeFacts:
    """What a node's own `mlstack-ds detect --json --python T` says that the install needs."""

    host: str
    platform: str
    archs: tuple[str, ...]  # the AMD GPU targets to build for (discrete ones when there are any)
    prefix: str  # the target environment's sys.prefix on the node


@dataclass
class NodeResult:
    """One node's part of the run, as `--json` reports it."""

    host: str
    action: str = "pending"  # installed | up-to-date | shared | rolled-back | failed | not-run | checked
    shares_with: str | None = None  # the node that installed into the same (shared) environment
    cache: str | None = None  # "shared" | "copied" | "present" | "index" (the node took the wheel from --index)
    receipt: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "action": self.action, "shares_with": self.shares_with, "cache": self.cache,
                "receipt": self.receipt, "error": self.error}


@dataclass
class NodeGroup:
    """Nodes that see one target environment: the first installs, the others share its result."""

    leader: NodeFacts
    probe: remote.SharedFileProbe | None  # a file the leader wrote into the environment, to recognise the others
    members: list[str] = field(default_factory=list)


def gpu_archs(gpus: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The AMD targets of detect's GPU list, as a single-node install picks them: the discrete GPUs,
    or the integrated ones when there is nothing else."""
    amd = [g for g in gpus if g.get("vendor", "amd") == "amd" and g.get("arch")]
    chosen = gfx.discrete_else_all(amd, lambda g: bool(g.get("integrated")))
    return tuple(dict.fromkeys(str(g["arch"]) for g in chosen))


def union_archs(per_node: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Every node's targets, in hostfile order; one wavefront size, since DeepSpeed's kernels are compiled
    for one (a usage error naming the nodes of each size otherwise)."""
    archs = tuple(dict.fromkeys(a for node_archs in per_node.values() for a in node_archs))
    by_wave = gfx.wavefront_groups((arch, host) for host, node_archs in per_node.items() for arch in node_archs)
    if len(by_wave) > 1:
        raise UsageError("the nodes' GPUs mix wavefront sizes: " + "; ".join(
            f"wave{w}: {', '.join(hosts)}" for w, hosts in sorted(by_wave.items())),
            hint="DeepSpeed's kernels are compiled for one wavefront size: install each family with its own "
            "hostfile (or choose the targets with --arch)")
    return archs


def node_facts(host: str, python: Path) -> NodeFacts:
    """Check one node (reachable, the target interpreter and this tool at the same paths) and ask the
    tool's own detect there; EnvironmentProblem naming the node otherwise."""
    gone = remote.check_reachable(host)
    if gone is not None:
        raise gone.error()
    if not remote.run_on(host, ["test", "-x", python]).ok:
        raise EnvironmentProblem(f"node {host} has no interpreter at {python}",
                                 hint="create the target environment at the same path on every node (a shared "
                                 "file system does it once)")
    check_tool(host)
    detected = run_tool(host, ["detect", "--python", python], timeout=DETECT_TIMEOUT_S)
    document = detected.document or {}
    if not detected.ok or "platform" not in document:
        raise EnvironmentProblem(f"node {host}: mlstack-ds detect failed: {detected.error_message()}",
                                 hint=detected.error_hint() or f"run `mlstack-ds detect --python {python}` there")
    prefix = str((document.get("python") or {}).get("prefix") or "")
    return NodeFacts(host, str(document["platform"]), gpu_archs(document.get("gpus") or []), prefix)


def check_platforms(facts: Sequence[NodeFacts], here: str) -> None:
    """One platform everywhere, and the one this host plans for (a ROCm wheel cannot serve a CPU node)."""
    platforms = {f.platform for f in facts}
    if len(platforms) > 1 or (platforms and here not in platforms):
        seen = "; ".join(f"{f.host}: {f.platform}" for f in facts)
        raise EnvironmentProblem(f"the nodes are not all {here} machines like this host ({seen})",
                                 hint="one install --hostfile serves nodes of one platform: split the hostfile")


def group_by_environment(facts: Sequence[NodeFacts], status: Callable[[str], None]) -> list[NodeGroup]:
    """Nodes that see the same target environment (a file one node writes into it is there on the other:
    a shared file system) form one group; it is installed once. A node that cannot write the probe
    file is a group of its own (its install then says why)."""
    groups: list[NodeGroup] = []
    try:
        for node in facts:
            group = next((g for g in groups if g.probe is not None and g.leader.prefix == node.prefix
                          and g.probe.seen_by(node.host)), None)
            if group is not None:
                group.members.append(node.host)
                status(f"{node.host}: shares the target environment with {group.leader.host}")
                continue
            groups.append(NodeGroup(node, remote.SharedFileProbe.on(node.host, Path(node.prefix),
                                                                    ".mlstack-ds-node-probe-")))
    except BaseException:
        remove_probes(groups)
        raise
    return groups


def remove_probes(groups: Sequence[NodeGroup]) -> None:
    for group in groups:
        if group.probe is not None:
            group.probe.remove()


def ensure_cached(host: str, wheel: Path, cache_root: Path) -> str:
    """Make the cache entry holding `wheel` (its directory: the wheel and build.json) exist at the same
    path on `host`: "shared" (the node sees this cache), "present" (it has the same wheel) or "copied"
    (scp into the cache's tmp/, then renamed into place, so a cut copy is never a valid entry)."""
    probe = remote.SharedFileProbe.here(cache_root / "tmp", "node-probe-")
    try:
        if probe.seen_by(host):
            return "shared"
    finally:
        probe.remove()
    digest = sha256_of(wheel)
    there = remote.run_on(host, ["sha256sum", wheel])
    if there.ok and there.stdout.split()[:1] == [digest]:
        return "present"
    entry = wheel.parent
    incoming = cache_root / "tmp" / f"incoming-{probe.content[:12]}"
    remote.copy_to(host, entry, incoming)
    moved = remote.run_on(host, ["sh", "-c", 'mkdir -p "$(dirname "$2")" && rm -rf -- "$2" && mv -- "$1" "$2" '
                                 '&& rmdir -- "$3"', "sh", incoming / entry.name, entry, incoming])
    if not moved.ok:
        raise EnvironmentProblem(f"node {host}: cannot put the wheel into its cache {cache_root}: "
                                 f"{moved.tail(1) or f'exit code {moved.returncode}'}",
                                 hint="the user running mlstack-ds must be able to write the cache on every node")
    return "copied"


def node_install_args(request: InstallRequest, python: Path, cache_root: Path, archs: Sequence[str],
                      cache_key: str, *, index: str | None = None) -> list[str]:
    """The node's `install` argv: the head's recipe, source (or `--offline DIR`: the node checks the bundle and
    holds its pip to it) and patch options, the head's targets, its cache path, and `--cached-wheel` so that
    it installs the head's wheel or fails (never builds). With
    `index` (the head found a fitting wheel there) each node takes it from the index itself instead:
    `--index URL --index-only` (with `--offline`, the bundle's own prebuilt wheel: `--index-only`), nothing
    copied, and still never a build."""
    # With --offline the bundle is the index already (its prebuilt wheels): the node is only told never to build.
    source = (["--index-only"] if request.offline is not None else ["--index", index, "--index-only"]) if index \
        else ["--cached-wheel", cache_key]
    origin = ["--offline", str(request.offline)] if request.offline is not None else ["--source", request.source]
    args: list[str] = ["install", "--python", str(python), "--cache-dir", str(cache_root),
                       "--recipe", request.deepspeed_version, *origin, *source, "--no-verify"]
    for flag, value in (("--git-url", request.git_url), ("--git-commit", request.git_commit),
                        ("--sha256", request.sha256)):
        if value:
            args += [flag, value]
    if archs:
        args += ["--arch", ",".join(archs)]
    if not request.patches:
        args.append("--no-patches")
    if request.force:
        args.append("--force")
    if request.lock_timeout is not None:  # each node's environment has its own lock: the same patience there
        args += ["--lock-timeout", f"{request.lock_timeout:g}"]
    return args


def receipt_summary(receipt: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not receipt:
        return None
    return {key: receipt.get(key) for key in ("deepspeed_version", "cache_key", "wheel_sha256", "archs", "ops",
                                              "installed_at", "python")}


def install_on(group: NodeGroup, args: Sequence[str]) -> ToolRun:
    return run_tool(group.leader.host, args, timeout=INSTALL_TIMEOUT_S)


def rollback_on(host: str, python: Path) -> str | None:
    """Undo this run's install on `host`; None when done, else why not (the run's error reports it)."""
    try:
        result = run_tool(host, ["rollback", "--python", python], timeout=ROLLBACK_TIMEOUT_S)
    except MlstackError as exc:
        return exc.message
    return None if result.ok else result.error_message()


def node_failure(host: str, run: ToolRun, rolled_back: Sequence[str], not_rolled_back: Mapping[str, str]
                 ) -> MlstackError:
    """The error of the run: the node and its reason, with the node's own exit code (install's 7 when it
    gave none of ours), and what happened to the nodes installed before it."""
    code = node_exit_code(run)
    undone = f"; rolled back on {', '.join(rolled_back)}" if rolled_back else ""
    stuck = "".join(f"; rollback failed on {h}: {why}" for h, why in not_rolled_back.items())
    return InstallError(f"node {host}: install failed: {run.error_message()}{undone}{stuck}",
                        hint=run.error_hint() or "fix that node and run the same command again",
                        exit_code=code)


def node_exit_code(run: ToolRun) -> ExitCode:
    """The node's own exit code when it is one of ours (not 0, not a crash's 1), else install's 7."""
    return ExitCode(run.returncode) if run.returncode in {int(c) for c in ExitCode} - {0, 1} else ExitCode.INSTALL


def require_ssh(hosts: Sequence[HostEntry]) -> None:
    """ssh and scp must exist here before the first node is asked anything (one clear error)."""
    for tool in ("ssh", "scp"):
        if runner.which(tool) is None:
            raise EnvironmentProblem(f"{tool} is not installed on this host; install --hostfile reaches the "
                                     f"{len(hosts)} node(s) with it",
                                     hint="install the OpenSSH client (Debian: apt-get install openssh-client)")


@dataclass(frozen=True)
class HostfileOutcome:
    plan: BuildPlan
    wheel: Path | None  # None on a dry run, and when every node installs from the index
    nodes: tuple[NodeResult, ...]
    verify: VerifyReport | None = None

    def to_json(self) -> dict[str, Any]:
        return {"action": "plan" if self.wheel is None else "installed", "plan": self.plan.to_dict(),
                "wheel": str(self.wheel) if self.wheel else None, "nodes": [n.to_json() for n in self.nodes],
                "verify": self.verify.to_json() if self.verify else None}


def run_hostfile_install(request: InstallRequest, hostfile: Path, output: Output,
                         progress: BuildProgress | None = None, *, dry_run: bool = False) -> HostfileOutcome:
    """Check every node, build here, install on each node, roll back on the first failure, verify."""
    if request.python is None:
        raise UsageError("install --hostfile needs the target interpreter's path", hint="pass --python PATH")
    python = request.python
    hosts = parse_hostfile(hostfile)
    require_ssh(hosts)
    results = {h.host: NodeResult(h.host) for h in hosts}

    def ready(host: str, found: NodeFacts) -> None:
        results[host].action = "checked"
        output.status(f"{host}: ready ({found.platform}"
                      + (f", GPU targets {','.join(found.archs)})" if found.archs else ")"))

    # all nodes at once (each check is a few ssh round trips and a detect there); reported in hostfile order,
    # so the first node that cannot take part is the one named, and its line comes after its predecessors'
    facts: list[NodeFacts] = on_each([h.host for h in hosts], lambda host: node_facts(host, python),
                                     done=ready, in_order=True)
    plan = plan_for_nodes(request, facts)
    cache_root, index, node_args = args_for_nodes(plan, python, output, dry_run=dry_run)
    if request.offline is not None:
        check_bundle_on_nodes(request.offline, [h.host for h in hosts], results, output, parallel=True,
                              dry_run=lambda host: run_tool(host, [*node_args, "--dry-run"], timeout=DETECT_TIMEOUT_S))
    if dry_run:
        return HostfileOutcome(plan.plan, None, tuple(results.values()))
    wheel = wheel_for_nodes(plan, index, output, progress)
    groups = group_by_environment(facts, output.status)
    ssh_ops = NodeOps(cache=lambda host: ensure_cached(host, wheel, cache_root) if wheel else "index",
                      install=lambda group: install_on(group, node_args), rollback=rollback_on)
    try:
        install_groups(groups, results, ops=ssh_ops, python=python, output=output)
    finally:
        remove_probes(groups)
    report = None
    if request.verify:
        output.status(f"verifying across the {len(hosts)} node(s) (mlstack-ds verify --hostfile)")
        report = run_verify(VerifyOptions(python=python, hostfile=hostfile), status=output.status)
    return HostfileOutcome(plan.plan, wheel, tuple(results.values()), report)


@dataclass(frozen=True)
class NodesPlan:
    """The one plan every node gets: for the union of their GPU targets, unless the user named targets."""
    request: InstallRequest  # with those targets
    prepared: Prepared

    @property
    def plan(self) -> BuildPlan:
        return self.prepared.plan


def plan_for_nodes(request: InstallRequest, facts: Sequence[NodeFacts]) -> NodesPlan:
    archs = union_archs({f.host: f.archs for f in facts}) if request.archs is None else ()
    effective = replace(request, archs=",".join(archs)) if archs else request
    prepared = prepare(effective)
    check_platforms(facts, prepared.plan.platform)
    return NodesPlan(effective, prepared)


def args_for_nodes(nodes: NodesPlan, python: Path, output: Output, *, dry_run: bool = False
                   ) -> tuple[Path, str | None, list[str]]:
    """(the head's cache root; the index every node installs from, or None: the head's wheel; the install
    command line each node runs). Known before the build, so that `--offline` can dry-run it on every node;
    a dry run names the cache without creating it."""
    plan = nodes.plan
    cache_dir = nodes.request.cache_dir
    cache_root = ((Path(cache_dir) if cache_dir is not None else default_cache_dir()) if dry_run
                  else Cache.open(cache_dir).root).absolute()
    index = index_for_nodes(nodes.prepared, output)
    node_args = node_install_args(nodes.request, python, cache_root, plan.archs if plan.platform == "rocm" else (),
                                  plan.cache_key, index=index)
    return cache_root, index, node_args


def wheel_for_nodes(nodes: NodesPlan, index: str | None, output: Output, progress: BuildProgress | None
                    ) -> Path | None:
    """The wheel built or reused here, or None when every node installs from the index."""
    return None if index else head_wheel(nodes.prepared, nodes.request, output, progress)


def check_bundle_on_nodes(bundle: Path, hosts: Sequence[str], results: Mapping[str, NodeResult], output: Output, *,
                          dry_run: Callable[[str], ToolRun], parallel: bool) -> None:
    """`--offline DIR`: every node runs its own install command with `--dry-run` (`dry_run(host)`), which checks
    the bundle against that node's Python and platform, and DIR as that node sees it, before the head builds
    and before anything changes on any node. A node the bundle does not cover: InstallError naming every such
    node, with the node's exit code (7: the bundle lacks something; 2: not a bundle there) and its hint (the
    `bundle` command that completes it for that node)."""
    runs = on_each(hosts, dry_run, in_order=True) if parallel else [dry_run(host) for host in hosts]
    failed = [(host, run) for host, run in zip(hosts, runs, strict=True) if not run.ok]
    for host, run in zip(hosts, runs, strict=True):
        if run.ok:
            output.status(f"{host}: the bundle {bundle} covers this install there")
    if not failed:
        return
    for host in hosts:
        results[host].action = "not-run"
    for host, run in failed:
        results[host].action, results[host].error = "failed", run.error_message()
        output.status(f"{host}: {run.error_message()}")
    code = node_exit_code(failed[0][1])
    unseen = " (--offline DIR must be the same path on every node: a shared file system)" if code == 2 else ""
    said = "; ".join(f"node {host}: {run.error_message().removesuffix(NOTHING_INSTALLED)}"
                     for host, run in failed)
    hints = dict.fromkeys(run.error_hint() for _host, run in failed if run.error_hint())
    raise with_nodes(InstallError(f"{len(failed)} of the {len(hosts)} node(s) cannot install from the bundle, so "
                                  f"nothing was installed on any node: {said}",
                                  hint=" | ".join(hints) + unseen if hints else f"fix the bundle{unseen}",
                                  exit_code=code), results)


def index_for_nodes(prepared: Prepared, output: Output) -> str | None:
    """The index every node installs from, when the head found a wheel there that fits the nodes' plan (the
    union of their targets); None: the head builds (or reuses its cache) and copies, as without --index."""
    choice = prepared.index
    if choice is None or choice.chosen is None:
        return None
    spec = choice.index.spec
    where = spec if spec.startswith(("http://", "https://", "file:")) else str(Path(spec).resolve())
    output.status(f"each node installs {choice.chosen.link.filename} from the index {where} (nothing is built "
                  "or copied; the nodes must reach the index)")
    return where


def head_wheel(prepared: Prepared, request: InstallRequest, output: Output, progress: BuildProgress | None) -> Path:
    """The wheel built (or found in the cache) here, for the nodes."""
    built = run_build(prepared, request, output, progress).built
    output.status(("reusing cached wheel " if built.cached else f"built in {built.seconds:.0f} s: ") + built.wheel.name)
    return built.wheel


@dataclass(frozen=True)
class NodeOps:
    """How the install reaches a node: over ssh (`--hostfile`) or through srun (`--slurm`, install/slurm.py).
    `cache(host)`: make the wheel's cache entry exist there ("shared" | "present" | "copied"); `install(group)`:
    run the node's `mlstack-ds install --cached-wheel` on the group's leader; `rollback(host, python)`: undo
    it, None when done, else why not."""

    cache: Callable[[str], str]
    install: Callable[[NodeGroup], ToolRun]
    rollback: Callable[[str, Path], str | None]


def install_groups(groups: Sequence[NodeGroup], results: Mapping[str, NodeResult], *, ops: NodeOps, python: Path,
                   output: Output) -> None:
    """Install group by group; on the first failure roll back what this run installed and raise."""
    installed: list[str] = []
    for group in groups:
        host = group.leader.host
        result = results[host]
        try:
            result.cache = ops.cache(host)
            run = ops.install(group)
        except MlstackError as exc:
            result.action, result.error = "failed", exc.message
            _roll_back(installed, results, python, output, ops)
            raise with_nodes(exc, results) from None
        if not run.ok:
            result.action, result.error = "failed", run.error_message()
            output.status(f"{host}: install failed: {result.error}")
            rolled, stuck = _roll_back(installed, results, python, output, ops)
            raise with_nodes(node_failure(host, run, rolled, stuck), results)
        document = run.document or {}
        result.action = str(document.get("action") or "installed")
        result.receipt = receipt_summary(document.get("receipt"))
        if result.action == "installed":
            installed.append(host)
        where = {"shared": "from the shared cache", "index": "from the index"}.get(result.cache or "",
                                                                                f"{result.cache} in its cache")
        output.status(f"{host}: {result.action} (the wheel {where})")
        for member in group.members:
            results[member].action, results[member].shares_with = "shared", host
            results[member].receipt = result.receipt
            output.status(f"{member}: {result.action} through {host} (shared environment)")


def _roll_back(installed: Sequence[str], results: Mapping[str, NodeResult], python: Path, output: Output,
               ops: NodeOps) -> tuple[list[str], dict[str, str]]:
    rolled: list[str] = []
    stuck: dict[str, str] = {}
    for host in reversed(installed):
        output.status(f"{host}: rolling back this run's install")
        why = ops.rollback(host, python)
        if why is None:
            rolled.append(host)
            results[host].action = "rolled-back"
        else:
            stuck[host] = why
            results[host].error = f"rollback failed: {why}"
        for other in results.values():
            if other.shares_with == host:
                other.action = results[host].action
    for result in results.values():
        if result.action == "checked":
            result.action = "not-run"
    return rolled, stuck


def with_nodes(error: MlstackError, results: Mapping[str, NodeResult]) -> MlstackError:
    """The error, carrying every node's result for --json."""
    error.details = {**error.details, "nodes": [r.to_json() for r in results.values()]}
    return error

"""`install --hostfile` and `install --slurm`: build the wheel once here, install that same wheel on every node,
all or nothing; written once against the node seam (cluster/transport.py), whichever way the nodes are reached.

Why this shape (docs/multinode.md): a multi-node job needs the same DeepSpeed build everywhere,
and compiling on every node would take as long per node as here and could give different builds. So:

1. every node is checked before anything happens (reachable, the target interpreter and this very tool
   at the same paths, its platform and GPU targets from the tool's own `detect` run there);
2. the targets are the union of the nodes' GPU archs (`--arch` overrides), one wavefront size;
3. the wheel is built (or found in the cache) here, once;
4. one round asks every node which of two files this host just wrote it sees: one in the wheel's cache entry,
   one in the target environment. Nodes that see the environment's share it (a venv on a shared file
   system) and it is installed once, by the first of them; a node that does not see the cache gets the
   entry copied to the same path first (where the transport copies files: ssh does, srun does not);
5. each group's node runs `mlstack-ds install --cached-wheel KEY` there, which refuses to build: a node
   whose plan differs fails naming the difference;
6. the first node that fails stops the run, and the nodes this run installed are rolled back; so does
   Ctrl-C/SIGTERM, after what the run still runs on the nodes is stopped (docs/multinode.md, "Faults").
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlstack_ds import gfx
from mlstack_ds.build.wheel import BuildProgress
from mlstack_ds.bundle.offline import NOTHING_INSTALLED
from mlstack_ds.cluster import slurm
from mlstack_ds.cluster.remote import SharedFileProbe
from mlstack_ds.cluster.srun_nodes import SrunNodes
from mlstack_ds.cluster.ssh_nodes import SshNodes
from mlstack_ds.cluster.tool import SAME_PATH_HINT, ToolRun
from mlstack_ds.cluster.transport import NodeTransport
from mlstack_ds.console import Output
from mlstack_ds.errors import (
    EnvironmentProblem,
    ExitCode,
    InstallError,
    Interrupted,
    MlstackError,
    UsageError,
)
from mlstack_ds.install.pipeline import InstallRequest, Prepared, prepare, run_build
from mlstack_ds.installed.receipt import receipt_path
from mlstack_ds.patience import WAITS
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.source.cache import Cache, default_cache_dir, sha256_of
from mlstack_ds.verify.report import VerifyReport
from mlstack_ds.verify.suite import VerifyOptions, run_verify

PROBE_NAME = ".mlstack-ds-node-probe-"  # the files this host writes to see which nodes share its file systems


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


def check_platforms(facts: Sequence[NodeFacts], here: str) -> None:
    """One platform everywhere, and the one this host plans for (a ROCm wheel cannot serve a CPU node)."""
    platforms = {f.platform for f in facts}
    if len(platforms) > 1 or (platforms and here not in platforms):
        seen = "; ".join(f"{f.host}: {f.platform}" for f in facts)
        raise EnvironmentProblem(f"the nodes are not all {here} machines like this host ({seen})",
                                 hint="one install --hostfile serves nodes of one platform: split the hostfile")


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


def node_failure(host: str, run: ToolRun, rolled_back: Sequence[str], not_rolled_back: Mapping[str, str]
                 ) -> MlstackError:
    """The error of the run: the node and its reason, with the node's own exit code (install's 7 when it
    gave none of ours), and what happened to the nodes installed before it."""
    code = node_exit_code(run)
    return InstallError(f"node {host}: install failed: {run.error_message()}{_undone(rolled_back, not_rolled_back)}",
                        hint=run.error_hint() or "fix that node and run the same command again",
                        exit_code=code)


def node_exit_code(run: ToolRun) -> ExitCode:
    """The node's own exit code when it is one of ours (not 0, not a crash's 1), else install's 7."""
    return ExitCode(run.returncode) if run.returncode in {int(c) for c in ExitCode} - {0, 1} else ExitCode.INSTALL


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
    """`install --hostfile`: the hostfile's nodes over ssh; verified by `verify --hostfile`."""
    python = target_python(request, "--hostfile")
    nodes = SshNodes.read(hostfile, command="install --hostfile")
    return install_on_nodes(request, python, nodes, output, progress, dry_run=dry_run,
                            verify=VerifyOptions(python=python, hostfile=hostfile))


def run_slurm_install(request: InstallRequest, output: Output, progress: BuildProgress | None = None, *,
                      dry_run: bool = False, env: Mapping[str, str] | None = None) -> HostfileOutcome:
    """`install --slurm`: the allocation's nodes through srun; verified by `verify --slurm`."""
    environ = dict(os.environ if env is None else env)
    allocation = slurm.current(environ)
    python = target_python(request, "--slurm")
    output.status(f"Slurm job {allocation.job_id}: {len(allocation.nodes)} node(s) ({', '.join(allocation.nodes)})")
    return install_on_nodes(request, python, SrunNodes(allocation, environ), output, progress, dry_run=dry_run,
                            verify=VerifyOptions(python=python, slurm=True))


def target_python(request: InstallRequest, option: str) -> Path:
    if request.python is None:
        raise UsageError(f"install {option} needs the target interpreter's path", hint="pass --python PATH")
    return request.python


def install_on_nodes(request: InstallRequest, python: Path, nodes: NodeTransport, output: Output,
                     progress: BuildProgress | None = None, *, dry_run: bool = False,
                     verify: VerifyOptions) -> HostfileOutcome:
    """Check every node, build here, install on each node (or once per shared environment), roll back on the
    first failure, verify across the nodes (`verify`)."""
    results = {host: NodeResult(host) for host in nodes.hosts}
    nodes.check_ready(python)
    facts = detect_nodes(nodes, python, results, output)
    plan = plan_for_nodes(request, facts)
    cache_root, index, node_args = args_for_nodes(plan, python, output, dry_run=dry_run)
    if request.offline is not None:
        check_bundle_on_nodes(request.offline, nodes, [*node_args, "--dry-run"], results, output)
    if dry_run:
        return HostfileOutcome(plan.plan, None, tuple(results.values()))
    wheel = wheel_for_nodes(plan, index, output, progress)
    groups, seeing_cache = group_nodes(nodes, facts, wheel, output)

    def place(host: str) -> str:
        if wheel is None:
            return "index"
        return "shared" if host in seeing_cache else copy_cache_entry(nodes, host, wheel, cache_root)

    install_groups(groups, results, nodes=nodes, node_args=node_args, place=place, python=python, output=output)
    report = None
    if request.verify:
        output.status(f"verifying across the {len(nodes.hosts)} node(s) (mlstack-ds verify {nodes.option})")
        report = run_verify(verify, status=output.status)
    return HostfileOutcome(plan.plan, wheel, tuple(results.values()), report)


def detect_nodes(nodes: NodeTransport, python: Path, results: Mapping[str, NodeResult], output: Output
                 ) -> list[NodeFacts]:
    """This tool's `detect --python PYTHON` on every node (a "ready" line each, in host order);
    EnvironmentProblem naming every node that did not answer with its facts."""
    facts: list[NodeFacts] = []
    problems: list[tuple[str, ToolRun]] = []

    def ready(host: str, run: ToolRun) -> None:
        document = run.document or {}
        if not run.ok or "platform" not in document:
            problems.append((host, run))
            return
        prefix = str((document.get("python") or {}).get("prefix") or "")
        found = NodeFacts(host, str(document["platform"]), gpu_archs(document.get("gpus") or []), prefix)
        facts.append(found)
        results[host].action = "checked"
        output.status(f"{host}: ready ({found.platform}"
                      + (f", GPU targets {','.join(found.archs)})" if found.archs else ")"))

    nodes.run_tool_on_each(["detect", "--python", python], patience=WAITS["node detect"], done=ready)
    if problems:
        said = [f"node {host}: mlstack-ds detect failed: {run.error_message()}" for host, run in problems]
        message = said[0] if len(said) == 1 else f"{len(said)} nodes cannot take part: {'; '.join(said)}"
        raise EnvironmentProblem(message, hint=problems[0][1].error_hint() or f"{SAME_PATH_HINT}; create --python's "
                                 f"environment at the same path on every node (`mlstack-ds detect --python {python}` "
                                 "there says why not)")
    return facts


def group_nodes(nodes: NodeTransport, facts: Sequence[NodeFacts], wheel: Path | None, output: Output
                ) -> tuple[list[NodeGroup], frozenset[str]]:
    """(the groups: nodes that see this host's copy of the first node's target environment form one, installed
    once; every other node is a group of its own; the nodes that see the wheel's cache entry). One round:
    each node is asked which of two files this host just wrote it sees. A transport that copies no files
    needs every node to see the cache (unless they install from an index: `wheel` None)."""
    prefix = Path(facts[0].prefix)
    written: list[SharedFileProbe] = []
    try:
        for directory in ([wheel.parent] if wheel is not None else []) + [prefix]:
            if not directory.is_absolute() or not directory.is_dir():
                continue  # not here (a node-local environment this host lacks): never created just to probe
            try:
                written.append(SharedFileProbe.here(directory, PROBE_NAME))
            except OSError:
                continue  # this host cannot write there: no node is taken to share it
        seen = nodes.sees([probe.path for probe in written]) if written else {}
    finally:
        for probe in written:
            probe.remove()
    cache_probe = next((str(p.path) for p in written if wheel is not None and p.path.parent == wheel.parent), None)
    env_probe = next((str(p.path) for p in written if p.path.parent == prefix), None)
    seeing_cache = frozenset(host for host, paths in seen.items() if cache_probe in paths)
    blind = [f.host for f in facts if f.host not in seeing_cache]
    if wheel is not None and blind and not nodes.copies_files:
        cache_root = wheel.parent.parent.parent  # <cache>/wheels/<key>/<wheel>
        raise EnvironmentProblem(f"node(s) {', '.join(blind)} do not see the wheel cache {cache_root}",
                                 hint=f"install {nodes.option} installs the wheel from the cache: give --cache-dir "
                                 "on a file system every node sees (e.g. under $HOME)")
    shared = [f for f in facts if f.prefix == str(prefix) and env_probe in seen.get(f.host, frozenset())]
    groups: list[NodeGroup] = []
    if shared:
        groups.append(NodeGroup(shared[0], [f.host for f in shared[1:]]))
        for member in shared[1:]:
            output.status(f"{member.host}: shares the target environment with {shared[0].host}")
    groups += [NodeGroup(f) for f in facts if f not in shared]
    order = [f.host for f in facts]
    return sorted(groups, key=lambda g: order.index(g.leader.host)), seeing_cache


def copy_cache_entry(nodes: NodeTransport, host: str, wheel: Path, cache_root: Path) -> str:
    """Make the cache entry holding `wheel` (its directory: the wheel and build.json) exist at the same path
    on `host`, which does not see this host's: "present" (it has the same wheel and build record) or "copied"
    (into the cache's tmp/, then renamed into place, so a cut copy is never a valid entry). Both files are
    compared: the node checks its entry against the record before installing, and a record cut short there
    would fail the node with a hint about a cache the user never wrote to; this one, checked here, repairs it."""
    entry = wheel.parent
    files = [wheel, entry / "build.json"]
    there = nodes.run(host, ["sha256sum", *files])
    if there.ok and [line.split()[:1] for line in there.stdout.splitlines()] == [[sha256_of(f)] for f in files]:
        return "present"
    incoming = cache_root / "tmp" / f"incoming-{secrets.token_hex(6)}"
    nodes.copy_to(host, entry, incoming)
    moved = nodes.run(host, ["sh", "-c", 'mkdir -p "$(dirname "$2")" && rm -rf -- "$2" && mv -- "$1" "$2" '
                             '&& rmdir -- "$3"', "sh", incoming / entry.name, entry, incoming])
    if not moved.ok:
        raise EnvironmentProblem(f"node {host}: cannot put the wheel into its cache {cache_root}: "
                                 f"{moved.tail(1) or f'exit code {moved.returncode}'}",
                                 hint="the user running mlstack-ds must be able to write the cache on every node")
    return "copied"


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


def check_bundle_on_nodes(bundle: Path, nodes: NodeTransport, dry_run_args: Sequence[str],
                          results: Mapping[str, NodeResult], output: Output) -> None:
    """`--offline DIR`: every node runs its own install command with `--dry-run` (`dry_run_args`), which checks
    the bundle against that node's Python and platform, and DIR as that node sees it, before the head builds
    and before anything changes on any node. A node the bundle does not cover: InstallError naming every such
    node, with the node's exit code (7: the bundle lacks something; 2: not a bundle there) and its hint (the
    `bundle` command that completes it for that node)."""
    hosts = nodes.hosts
    runs = nodes.run_tool_on_each(dry_run_args, patience=WAITS["node detect"])
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


def install_groups(groups: Sequence[NodeGroup], results: Mapping[str, NodeResult], *, nodes: NodeTransport,
                   node_args: Sequence[str], place: Callable[[str], str], python: Path, output: Output) -> None:
    """Install group by group; on the first failure, or Ctrl-C/SIGTERM, stop what the run still runs on the
    nodes, roll back what this run installed and raise."""
    run_id = f"mlstack-install-{secrets.token_hex(8)}"
    installed: list[str] = []
    current, before = groups[0].leader, None  # the node being installed; its receipt before (None: unread)
    try:
        for group in groups:
            current, before = group.leader, None
            before = receipt_text(nodes, current.host, current.prefix)
            _install_group(group, results, installed, run_id, nodes=nodes, node_args=node_args, place=place,
                           python=python, output=output)
    except KeyboardInterrupt:
        raise _stopped(current, before, run_id, installed, results, nodes=nodes, python=python,
                       output=output) from None


def _install_group(group: NodeGroup, results: Mapping[str, NodeResult], installed: list[str], run_id: str, *,
                   nodes: NodeTransport, node_args: Sequence[str], place: Callable[[str], str], python: Path,
                   output: Output) -> None:
    """One group's install (`installed`: the nodes this run changed, to which it adds its leader); on failure
    roll back `installed` and raise."""
    host = group.leader.host
    result = results[host]
    try:
        result.cache = place(host)
        output.status(f"{host}: installing")
        run = nodes.run_tool(host, node_args, patience=WAITS["node install"], run_id=run_id)
    except MlstackError as exc:
        result.action, result.error = "failed", exc.message
        gone = lost_node(nodes, host)
        rolled, stuck = _roll_back(installed, results, python, output, nodes)
        raise with_nodes(gone or exc, results, undone=_undone(rolled, stuck)) from None
    if not run.ok:
        result.action, result.error = "failed", run.error_message()
        output.status(f"{host}: install failed: {result.error}")
        gone = lost_node(nodes, host)
        rolled, stuck = _roll_back(installed, results, python, output, nodes)
        raise with_nodes(gone or node_failure(host, run, rolled, stuck), results,
                         undone=_undone(rolled, stuck) if gone else "")
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


def lost_node(nodes: NodeTransport, host: str) -> EnvironmentProblem | None:
    """The error of a node whose install failed because the node went away (its link, its power:
    `NodeTransport.lost`, asked only after a failure), or None when it still answers (its install failed).
    Its own install may go on, or even finish, there: the hint says that the next run repairs it."""
    try:
        why = nodes.lost().get(host)
    except MlstackError:
        return None
    if why is None:
        return None
    return EnvironmentProblem(f"node {host} {why}",
                              hint=f"once {host} answers again, run the same command again: it brings every node "
                              "to this build, whatever that node's own install did meanwhile")


def receipt_text(nodes: NodeTransport, host: str, prefix: str) -> str:
    """The node's receipt as it is now ("" when it has none): a stopped run compares it afterwards to learn
    whether the node's own install got as far as changing the environment."""
    return nodes.run(host, ["sh", "-c", 'cat -- "$1" 2>/dev/null; exit 0', "sh", receipt_path(prefix)]).stdout


def _stopped(leader: NodeFacts, before: str | None, run_id: str, installed: list[str],
             results: Mapping[str, NodeResult], *, nodes: NodeTransport, python: Path, output: Output
             ) -> MlstackError:
    """Ctrl-C or SIGTERM while `leader` was being installed (`before`: its receipt then, None if unread):
    whatever the run still runs on the nodes is stopped (the node's install finishes the package swap it is
    in, then ends), the node joins those to roll back when its receipt changed meanwhile, and every node this
    run installed is rolled back."""
    output.status(f"interrupted: stopping this run on the {len(results)} node(s)")
    nodes.stop(run_id)
    host = leader.host
    results[host].action = "failed"
    results[host].error = "interrupted"
    unknown = ""
    try:
        if host not in installed and before is not None and receipt_text(nodes, host, leader.prefix) != before:
            installed.append(host)
    except MlstackError as exc:
        unknown = f"; {host}: its install may have finished there ({exc.message})"
    rolled, stuck = _roll_back(installed, results, python, output, nodes)
    if host not in installed and not unknown:
        results[host].action = "not-run"
    said = _undone(rolled, stuck) or "; no node had been changed"
    return with_nodes(Interrupted(f"interrupted: the install over {len(results)} node(s) was stopped{said}"
                                  f"{unknown}",
                                  hint="nothing of the run is left running; run the same command again to install"
                                  if not stuck and not unknown else "run the same command again: it brings every "
                                  "node to this build"), results)


def _undone(rolled: Sequence[str], stuck: Mapping[str, str]) -> str:
    """What a failed run did to the nodes installed before it failed, for its error message."""
    undone = f"; rolled back on {', '.join(rolled)}" if rolled else ""
    return undone + "".join(f"; rollback failed on {h}: {why}" for h, why in stuck.items())


def _roll_back(installed: Sequence[str], results: Mapping[str, NodeResult], python: Path, output: Output,
               nodes: NodeTransport) -> tuple[list[str], dict[str, str]]:
    rolled: list[str] = []
    stuck: dict[str, str] = {}
    for host in reversed(installed):
        output.status(f"{host}: rolling back this run's install")
        why = rollback_on(nodes, host, python)
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


def rollback_on(nodes: NodeTransport, host: str, python: Path) -> str | None:
    """Undo this run's install on `host`; None when done, else why not (the run's error reports it)."""
    try:
        result = nodes.run_tool(host, ["rollback", "--python", python], patience=WAITS["node rollback"])
    except MlstackError as exc:
        return exc.message
    return None if result.ok else result.error_message()


def with_nodes(error: MlstackError, results: Mapping[str, NodeResult], *, undone: str = "") -> MlstackError:
    """The error, carrying every node's result for --json (and `undone`, what became of the nodes this run
    had installed, added to its message)."""
    error.message += undone
    error.details = {**error.details, "nodes": [r.to_json() for r in results.values()]}
    return error

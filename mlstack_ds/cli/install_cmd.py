"""`mlstack-ds install | status | rollback | uninstall`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from mlstack_ds.build.wheel import BuildProgress
from mlstack_ds.bundle.manifest import read_manifest
from mlstack_ds.cli.options import (
    DEFAULT_RECIPE,
    DEFAULT_SOURCE,
    ArchOption,
    CacheDirOption,
    DryRunOption,
    GitCommitOption,
    GitUrlOption,
    IndexOption,
    InstallHostfileOption,
    InstallSlurmOption,
    JobsOption,
    JsonOption,
    LockTimeoutOption,
    NoPatchesOption,
    OfflineOption,
    PythonOption,
    RebuildOption,
    RecipeOption,
    Sha256Option,
    SourceOption,
)
from mlstack_ds.cluster.slurm import refuse_with_hostfile
from mlstack_ds.console import Cell, Output, make_output, print_records
from mlstack_ds.errors import Interrupted, UsageError, VerifyFailed
from mlstack_ds.install.nodes import run_hostfile_install, run_slurm_install
from mlstack_ds.install.pipeline import InstallRequest, Prepared, prepare, run_build, run_install
from mlstack_ds.install.wheel import rollback, uninstall
from mlstack_ds.installed.health import check_health, probe_installed
from mlstack_ds.installed.journal import unfinished_change
from mlstack_ds.installed.receipt import read_receipt, receipt_path
from mlstack_ds.plan.buildjobs import BuildConcurrency
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.plan.targets import target_source_text
from mlstack_ds.source.checkout import short_pin
from mlstack_ds.verify.report import VerifyReport, render_report


@contextlib.contextmanager
def build_interrupt_says_nothing_changed() -> Iterator[None]:
    """Ctrl-C or SIGTERM (turned into KeyboardInterrupt for every command by cli/app.py) during a build:
    the compiler's process group is already killed; say that nothing was installed."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise Interrupted(
            "interrupted: the build was stopped before anything was installed",
            hint="the environment is as it was; run the same install again to resume (downloads are cached)",
        ) from exc


NoVerifyOption = Annotated[bool, typer.Option("--no-verify", help="Skip `mlstack-ds verify` after installing.")]
ForceOption = Annotated[bool, typer.Option(
    "--force", help="Reinstall even if the same plan is installed and healthy.")]
CachedWheelOption = Annotated[str | None, typer.Option(
    "--cached-wheel", hidden=True, metavar="KEY",
    help="Install the cached wheel of this plan or fail; never build (each node of --hostfile).")]
IndexOnlyOption = Annotated[bool, typer.Option(
    "--index-only", help="With --index (or --offline): refuse (exit 7) instead of building when no prebuilt wheel "
    "of the index (or bundle) fits.")]
WheelDirOption = Annotated[Path | None, typer.Option("--wheel-dir", help="Also copy the wheel into this directory.")]


def install_command(
    recipe: RecipeOption = DEFAULT_RECIPE,
    source: SourceOption = DEFAULT_SOURCE,
    git_url: GitUrlOption = None,
    git_commit: GitCommitOption = None,
    sha256: Sha256Option = None,
    arch: ArchOption = None,
    python: PythonOption = None,
    jobs: JobsOption = None,
    cache_dir: CacheDirOption = None,
    no_patches: NoPatchesOption = False,
    no_verify: NoVerifyOption = False,
    dry_run: DryRunOption = False,
    json_output: JsonOption = False,
    force: ForceOption = False,
    rebuild: RebuildOption = False,
    hostfile: InstallHostfileOption = None,
    cached_wheel: CachedWheelOption = None,
    lock_timeout: LockTimeoutOption = None,
    slurm: InstallSlurmOption = False,
    index: IndexOption = None,
    index_only: IndexOnlyOption = False,
    offline: OfflineOption = None,
) -> None:
    """Build DeepSpeed's ops ahead of time for exactly this machine's GPUs, install, and check.

    Safe to re-run (an identical healthy install is left alone), to interrupt (the environment is
    only changed once the wheel exists) and to get wrong (refusals say what to fix).
    """
    output = make_output(json_output)
    request = _request(recipe, source, git_url, git_commit, sha256, arch, python, jobs, cache_dir, no_patches, rebuild,
                       verify=not no_verify, force=force, cached_wheel=cached_wheel, lock_timeout=lock_timeout,
                       index=index or None, index_only=index_only,
                       # absolute: with --hostfile/--slurm each node is given this path (DIR on a shared file system)
                       offline=Path(os.path.abspath(offline)) if offline is not None else None)
    if offline is not None:
        refuse_with_offline(offline, source=source, git=git_url or git_commit, sha256=sha256, index=index)
        read_manifest(request.offline)  # not a bundle: exit 2 at once, before any node (or the target) is asked
    if index_only and not index and offline is None:
        raise UsageError("--index-only needs --index (or MLSTACK_DS_INDEX) or --offline",
                         hint="name the index: --index URL|DIR")
    refuse_with_hostfile(slurm, hostfile)
    if hostfile is not None or slurm:
        if cached_wheel is not None:
            raise UsageError(f"--cached-wheel is what install {'--slurm' if slurm else '--hostfile'} passes to each "
                             "node", hint="leave it out")
        install_across(request, hostfile, output, json_output=json_output, dry_run=dry_run)
        return
    prepared = _plan_or_dry_run(request, output, json_output=json_output, dry_run=dry_run)
    if prepared is None:
        return
    plan = prepared.plan
    with _building(output) as progress:
        outcome = run_install(prepared, request, output, progress)
    report = outcome.verify
    failure = verify_failure(report, "DeepSpeed was installed",
                             f"details: mlstack-ds verify --python {plan.target_python}; "
                             "`mlstack-ds rollback` restores the previous DeepSpeed")
    if json_output:
        output.emit_json({"action": outcome.action, "plan": plan.to_dict(), "receipt": outcome.receipt.to_dict(),
                          "verify": report.to_json() if report else None,
                          **({"index": prepared.index.to_json()} if prepared.index else {})}, error=failure)
    elif report is not None:
        render_report(report, output.out)
    if failure is not None:
        raise failure
    if json_output:
        return
    if outcome.action == "up-to-date":
        output.out.print(f"DeepSpeed {plan.deepspeed_version} is already installed with this plan and healthy; "
                         "nothing to do (--force reinstalls).")
    else:
        output.out.print(f"[green]installed[/] DeepSpeed {outcome.receipt.deepspeed_version} with prebuilt ops: "
                         + ", ".join(plan.built_ops))


def refuse_with_offline(offline: Path, *, source: str, git: str | None, sha256: str | None, index: str | None
                        ) -> None:
    """`--offline DIR` is the source and the index at once: another one named beside it is a usage error."""
    clash = ("--source" if source != DEFAULT_SOURCE else "--git-url/--git-commit" if git else "--sha256" if sha256
             else "--index (or MLSTACK_DS_INDEX)" if index else None)
    if clash is not None:
        raise UsageError(f"--offline {offline} takes the source and every requirement from the bundle; {clash} "
                         "cannot be used with it", hint=f"leave out {clash}")


def build_command(
    recipe: RecipeOption = DEFAULT_RECIPE,
    source: SourceOption = DEFAULT_SOURCE,
    git_url: GitUrlOption = None,
    git_commit: GitCommitOption = None,
    sha256: Sha256Option = None,
    arch: ArchOption = None,
    python: PythonOption = None,
    jobs: JobsOption = None,
    cache_dir: CacheDirOption = None,
    wheel_dir: WheelDirOption = None,
    no_patches: NoPatchesOption = False,
    dry_run: DryRunOption = False,
    json_output: JsonOption = False,
    rebuild: RebuildOption = False,
) -> None:
    """Build the DeepSpeed wheel with prebuilt ops and stop: nothing is installed.

    For login nodes, CI and container images, where no GPU is visible: name the targets with `--arch`
    (or `PYTORCH_ROCM_ARCH`). The wheel lands in the wheel cache (and in `--wheel-dir`); `install` with
    the same plan on a machine sharing the cache then reuses it.
    """
    output = make_output(json_output)
    request = _request(recipe, source, git_url, git_commit, sha256, arch, python, jobs, cache_dir, no_patches, rebuild,
                       verify=False)
    prepared = _plan_or_dry_run(request, output, json_output=json_output, dry_run=dry_run)
    if prepared is None:
        return
    plan = prepared.plan
    with _building(output) as progress:
        outcome = run_build(prepared, request, output, progress, wheel_dir=wheel_dir)
    built = outcome.built
    if json_output:
        output.emit_json({"action": "cached" if built.cached else "built", "plan": plan.to_dict(),
                          "wheel": str(built.wheel), "sha256": built.sha256,
                          "copied_to": str(outcome.copied_to) if outcome.copied_to else None,
                          "seconds": round(built.seconds, 1)})
        return
    verb = "reused the cached wheel" if built.cached else f"built in {built.seconds:.0f} s"
    output.out.print(f"{verb}: {escape(str(built.wheel))}")
    if outcome.copied_to:
        output.out.print(f"copied to {escape(str(outcome.copied_to))}")
    output.out.print(f"sha256 {built.sha256}; ops: {', '.join(plan.built_ops) or 'none'}"
                     + (f"; targets {', '.join(plan.archs)}" if plan.archs else ""))


def _request(recipe: str, source: str, git_url: str | None, git_commit: str | None, sha256: str | None,
             arch: str | None, python: Path, jobs: int | None, cache_dir: Path | None, no_patches: bool,
             rebuild: bool, **install: Any) -> InstallRequest:
    """The request from the options `install` and `build` share; `install` adds its own (verify, force...)."""
    return InstallRequest(deepspeed_version=recipe, source=source, git_url=git_url, git_commit=git_commit,
                          sha256=sha256, archs=arch, python=python, jobs=jobs, cache_dir=cache_dir,
                          patches=not no_patches, rebuild=rebuild, **install)


def _plan_or_dry_run(request: InstallRequest, output: Output, *, json_output: bool, dry_run: bool) -> Prepared | None:
    """What `install` and `build` do before building: detect and plan, then show the plan. With --dry-run
    the plan is the answer (stdout) and there is nothing more to do (None); otherwise it is progress
    information (stderr, not with --json)."""
    prepared = prepare(request)
    if prepared.index is not None and prepared.index.chosen is None:
        for offer in prepared.index.offers:
            output.warn(escape(f"index wheel {offer.link.filename} does not fit: {'; '.join(offer.reasons)}"))
        output.warn(escape(f"no wheel of the index {prepared.index.index.spec} fits this machine: building here"
                           if prepared.index.offers else f"the index {prepared.index.index.spec} has no DeepSpeed "
                           "wheels: building here"))
    if dry_run:
        if json_output:
            output.emit_json({"action": "plan", "plan": prepared.plan.to_dict(),
                              **({"index": prepared.index.to_json()} if prepared.index else {})})
        else:
            render_plan(prepared.plan, output, output.out)
        return None
    if not json_output:
        render_plan(prepared.plan, output, output.err)
    return prepared


@contextlib.contextmanager
def _building(output: Output) -> Iterator[BuildProgress]:
    """The build's live progress line, and the message that an interrupted build changed nothing."""
    with build_interrupt_says_nothing_changed(), _build_progress(output) as progress:
        yield progress


def status_command(python: PythonOption = None, json_output: JsonOption = False) -> None:
    """Show what mlstack-ds installed into an environment (the receipt) and whether it still holds."""
    output = make_output(json_output)
    interpreter = str(python)
    state = probe_installed(interpreter)
    prefix = state.prefix
    receipt = read_receipt(prefix)
    health = check_health(receipt, state) if receipt is not None else None
    change = unfinished_change(prefix, interpreter)
    problems = ([change] if change else []) + (list(health.problems) if health else [])
    intact = health is not None and health.intact and change is None
    document = {"python": interpreter, "receipt_path": str(receipt_path(prefix)),
                "receipt": receipt.to_dict() if receipt else None, "installed": state.__dict__,
                "intact": intact, "problems": problems,
                "files": health.files.to_dict() if health and health.files else None}
    if json_output:
        output.emit_json(document)
        return
    if receipt is None:
        output.out.print(f"no mlstack-ds install in {prefix}"
                         + (f" (DeepSpeed {state.deepspeed_version} is installed by something else)"
                            if state.deepspeed_version else ""))
        if change:
            output.warn(escape(change))
        return
    rows: list[tuple[str, Cell]] = [
        (key, str(getattr(receipt, key))) for key in ("deepspeed_version", "source", "source_commit", "platform",
                                                      "archs", "ops", "torch_version", "installed_at", "wheel")]
    rows.append(("patches", [p["name"] for p in receipt.patches] or ["none"]))
    rows.append(("previous", str(receipt.previous.deepspeed_version or "none")))
    rows.append(("state", Text("intact", style="green") if intact else Text("changed since install", style="red")))
    if health is not None and health.files is not None and health.files.ok:
        rows.append(("files", f"{health.files.checked} match RECORD"))
    if problems:
        rows.append(("problem", problems))
    print_records(output.out, ("", ""), rows, keyed=True)
    if not intact and change is None:
        output.warn("`mlstack-ds install --force` reinstalls what the receipt describes; "
                    "`mlstack-ds rollback` restores the previous DeepSpeed")


def rollback_command(python: PythonOption = None, json_output: JsonOption = False,
                     lock_timeout: LockTimeoutOption = None) -> None:
    """Reinstall the DeepSpeed that was there before the last `install` (from the wheel cache)."""
    output = make_output(json_output)
    interpreter = str(python)
    summary = rollback(interpreter, probe_installed(interpreter), status=output.status, lock_timeout=lock_timeout,
                       waiting=output.warn)
    _report_change(output, json_output, interpreter, "rolled-back", summary)


def uninstall_command(python: PythonOption = None, json_output: JsonOption = False,
                      lock_timeout: LockTimeoutOption = None) -> None:
    """Remove the DeepSpeed that mlstack-ds installed; one it did not install is skipped (exit 0), like pip."""
    output = make_output(json_output)
    interpreter = str(python)
    action, summary = uninstall(interpreter, probe_installed(interpreter), lock_timeout=lock_timeout,
                                waiting=output.warn)
    if action == "skipped" and not json_output:  # like pip: a warning, exit 0
        output.warn(escape(summary))
        return
    _report_change(output, json_output, interpreter, action, summary)


def register(app: typer.Typer) -> None:
    app.command("install")(install_command)
    app.command("build")(build_command)
    app.command("status")(status_command)
    app.command("rollback")(rollback_command)
    app.command("uninstall")(uninstall_command)


def verify_failure(report: VerifyReport | None, done: str, hint: str) -> VerifyFailed | None:
    """The error of an install whose verify failed (exit 8), or None: the install itself stands. The first failure's
    reason is said too: when every check failed at once (the launch itself), it is the one that matters."""
    if report is None or report.ok:
        return None
    failed = [c for c in report.checks if c.status == "fail"]
    first = f" ({failed[0].name}: {failed[0].reason})" if failed and failed[0].reason else ""
    return VerifyFailed(f"{done}, but {len(failed)} verify check(s) failed: {', '.join(c.name for c in failed)}"
                        f"{first}", hint=hint)


def install_across(request: InstallRequest, hostfile: Path | None, output: Output, *, json_output: bool,
                   dry_run: bool) -> None:
    """`install --hostfile` (or, without a hostfile, `--slurm`): the plan, one status line per node, one
    document (or table) at the end."""
    with _building(output) as progress:
        outcome = (run_hostfile_install(request, hostfile, output, progress, dry_run=dry_run) if hostfile is not None
                   else run_slurm_install(request, output, progress, dry_run=dry_run))
    plan, report = outcome.plan, outcome.verify
    nodes = f"--hostfile {hostfile}" if hostfile is not None else "--slurm"
    failure = verify_failure(report, "DeepSpeed was installed on every node",
                             f"details: mlstack-ds verify {nodes} --python {plan.target_python}; "
                             "`mlstack-ds rollback` on each node restores the previous DeepSpeed")
    if json_output:
        output.emit_json(outcome.to_json(), error=failure)
    else:
        render_plan(plan, output, output.out if dry_run else output.err)
        print_records(output.out, ("node", "action", "wheel", "receipt"), [
            (n.host, n.action + (f" (with {n.shares_with})" if n.shares_with else ""), n.cache or "",
             (n.receipt or {}).get("installed_at") or "") for n in outcome.nodes], title="nodes")
        if report is not None:
            render_report(report, output.out)
    if failure is not None:
        raise failure


def _report_change(output: Output, json_output: bool, interpreter: str, action: str, summary: str) -> None:
    """The one-line summary, or a document with what the environment holds now (for scripts)."""
    if not json_output:
        output.out.print(summary)
        return
    output.emit_json({"python": interpreter, "action": action, "summary": summary,
                      "installed": probe_installed(interpreter).__dict__})


def render_plan(plan: BuildPlan, output: Output, console: Console) -> None:
    """The plan on `console` (a table only where it fits whole); its notes are warnings (stderr) either way.
    Patch names and flags are copied by users: `print_records` never cuts them short."""
    head: list[tuple[str, Cell]] = [
        ("DeepSpeed", f"{plan.deepspeed_version} from {plan.source} (pin {short_pin(plan.source_pin)})"),
        ("patches", [p.name for p in plan.patches] or ["none"]),
        ("platform", f"{plan.platform} (DS_ACCELERATOR={plan.accelerator})"),
    ]
    if plan.archs:
        source = f", from {target_source_text(plan.targets_source, plan.platform)}" if plan.targets_source else ""
        wave = f" (wave{plan.wavefront})" if plan.wavefront else ""
        head.append(("targets", ", ".join(plan.archs) + wave + source))
    head += [
        ("python", f"{plan.target_python} (torch {plan.torch_version})"),
        ("cache key", plan.cache_key),
        *([("prebuilt", f"{plan.prebuilt} (no toolchain needed: nothing is compiled here)")] if plan.prebuilt
          else [("compiles", describe_concurrency(plan.concurrency))] if plan.concurrency else []),
        ("build env", " ".join(f"{key}={value}" for key, value in plan.env.items())),
    ]
    print_records(console, ("", ""), head, keyed=True)
    print_records(console, ("op", "build", "why"),
                  [(op.name, Text("yes", style="green") if op.build else "no", op.reason) for op in plan.ops],
                  title="ops")
    for note in plan.notes:
        output.warn(escape(note))


def describe_concurrency(c: BuildConcurrency) -> str:
    """`4 at once: 2 ops x 2 files (bounded by cpus)`: what `--jobs` became, and why not more."""
    parts = [f"{c.ops_at_once} op{'s' if c.ops_at_once > 1 else ''}",
             f"{c.jobs_per_op} file{'s' if c.jobs_per_op > 1 else ''}"]
    if c.archs_at_once > 1:
        parts.append(f"{c.archs_at_once} archs")
    return f"{c.processes} at once: {' x '.join(parts)} (bounded by {c.limit})"


@contextlib.contextmanager
def _build_progress(output: Output) -> Iterator[BuildProgress]:
    """A live line on stderr: the op being compiled, ninja's step, elapsed time."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=output.err,
                  transient=True) as bar:
        task = bar.add_task("building", total=None)

        def update(state: BuildProgress) -> None:
            bar.update(task, description=f"compiling {state.op} {state.step}".rstrip())

        yield BuildProgress(on_change=update)


__all__ = ["register"]

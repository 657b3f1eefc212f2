"""The install pipeline: detect -> plan -> (dry run stops here) -> build -> install -> verify.

One function per user-visible command; the CLI only parses options and renders what comes back.
The target interpreter is probed once by detect (`Prepared.target`); `run_install` judges the installed
state from that answer and hands it to verify, and probes again only after pip changed the environment.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.build import BuildProgress, BuiltWheel, build_wheel
from mlstack_ds.console import Output
from mlstack_ds.detect import Environment
from mlstack_ds.detect.environment import detect_with_target
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.errors import EnvironmentProblem, UsageError
from mlstack_ds.install import InstalledState, check_health, install_wheel, installed_state
from mlstack_ds.patches import series_for_recipe
from mlstack_ds.plan import BuildPlan, PatchRef, PlanOptions, make_plan
from mlstack_ds.receipt import Receipt, ReceiptError, read_receipt
from mlstack_ds.recipe import Recipe, find_recipe
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import SourceSpec, check_local_source, parse_source_spec, source_pin
from mlstack_ds.targets import parse_arch_option
from mlstack_ds.toolchain import probe_toolchain
from mlstack_ds.verify.report import VerifyReport
from mlstack_ds.verify.suite import VerifyOptions, run_verify


@dataclass(frozen=True)
class InstallRequest:
    deepspeed_version: str = "0.19.5"
    source: str = "pypi"
    git_url: str | None = None
    git_commit: str | None = None
    sha256: str | None = None
    archs: str | None = None
    python: Path | None = None
    jobs: int | None = None
    cache_dir: Path | None = None
    patches: bool = True
    verify: bool = True
    force: bool = False
    rebuild: bool = False


@dataclass(frozen=True)
class Prepared:
    environment: Environment
    recipe: Recipe
    spec: SourceSpec
    plan: BuildPlan
    target: TargetFacts  # detect's answer from the target interpreter, reused instead of asking again


@dataclass(frozen=True)
class BuildOutcome:
    plan: BuildPlan
    built: BuiltWheel
    copied_to: Path | None  # the --wheel-dir copy


@dataclass(frozen=True)
class InstallOutcome:
    plan: BuildPlan
    action: str  # "installed" | "up-to-date"
    receipt: Receipt
    built: BuiltWheel | None
    verify: VerifyReport | None = None


def patch_refs(recipe: Recipe) -> list[PatchRef]:
    series = series_for_recipe(recipe)
    return [PatchRef(p.name, hashlib.sha256(p.path.read_bytes()).hexdigest()) for p in series.patches]


def prepare(request: InstallRequest) -> Prepared:
    """Everything up to the plan; touches nothing (this is `install --dry-run`)."""
    if request.jobs is not None and request.jobs < 1:
        raise UsageError(f"--jobs {request.jobs}: must be at least 1", hint="e.g. --jobs 4")
    recipe = find_recipe(request.deepspeed_version)  # a version ("0.19.5"), a recipe's name or its file
    spec = parse_source_spec(request.source, git_url=request.git_url, git_commit=request.git_commit,
                             sha256=request.sha256)
    check_local_source(spec)
    archs = parse_arch_option(request.archs) if request.archs is not None else None
    detection = detect_with_target(python=request.python)
    environment = detection.environment
    rocm_root = Path(environment.rocm.root) if environment.rocm and environment.rocm.root else None
    toolchain = probe_toolchain(os.environ, rocm_root, environment.python.include_dir)
    options = PlanOptions(source=request.source, archs=archs, jobs=request.jobs, patches=request.patches,
                          source_pin=source_pin(recipe, spec))
    plan = make_plan(environment, recipe, toolchain, patch_refs(recipe) if request.patches else [], options)
    return Prepared(environment, recipe, spec, plan, detection.target)


def healthy(plan: BuildPlan, receipt: Receipt | None, state: InstalledState) -> bool:
    """Our receipt for this very plan, and the environment still holds what it describes."""
    return not reinstall_reasons(plan, receipt, state)


def reinstall_reasons(plan: BuildPlan, receipt: Receipt | None, state: InstalledState) -> list[str]:
    """Why `install` cannot leave the environment alone (empty: an identical, intact install). The damage
    found by `check_health` (missing or modified files, DeepSpeed removed, torch changed) is reported."""
    if receipt is None:
        return ["no mlstack-ds install in this environment"]
    if receipt.cache_key != plan.cache_key:
        return ["the installed build is of another plan"]
    if set(receipt.ops) != set(plan.built_ops):
        return ["the installed ops are not the planned ones"]
    return list(check_health(receipt, state).problems)


def run_build(prepared: Prepared, request: InstallRequest, output: Output, progress: BuildProgress | None = None,
              wheel_dir: Path | None = None) -> BuildOutcome:
    """`mlstack-ds build`: the wheel of the plan (from the cache, or built), copied to `wheel_dir`;
    nothing is installed, so it runs on login nodes and in image builds without a GPU."""
    if wheel_dir is not None and wheel_dir.exists() and not wheel_dir.is_dir():
        raise UsageError(f"--wheel-dir {wheel_dir}: not a directory", hint="name a directory (it is created)")
    cache = Cache.open(request.cache_dir)
    built = build_wheel(prepared.plan, prepared.recipe, prepared.spec, cache, os.environ, force=request.rebuild,
                        progress=progress, status=output.status)
    copied = copy_wheel(built.wheel, wheel_dir) if wheel_dir is not None else None
    return BuildOutcome(prepared.plan, built, copied)


def copy_wheel(wheel: Path, directory: Path) -> Path:
    """Copy the wheel into `directory` under its own name, atomically (a reader never sees half a file)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / wheel.name
        partial = directory / f".{wheel.name}.partial"
        shutil.copyfile(wheel, partial)
        os.replace(partial, target)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the wheel to {directory}: {exc.strerror or exc}",
                                 hint="choose a writable --wheel-dir") from exc
    return target


def run_install(prepared: Prepared, request: InstallRequest, output: Output,
                progress: BuildProgress | None = None) -> InstallOutcome:
    plan = prepared.plan
    prefix = prepared.environment.python.prefix
    if not prefix:
        raise EnvironmentProblem(f"cannot tell the environment prefix of {plan.target_python}",
                                 hint="check that --python runs")
    cache = Cache.open(request.cache_dir)  # a bad --cache-dir is an error even when nothing needs building
    forced = request.force or request.rebuild
    try:
        receipt = read_receipt(prefix)
    except ReceiptError:
        if not forced:  # its hint: --force replaces it
            raise
        receipt = None  # install_wheel warns about it and writes a new one
    # detect's probe, moments ago, already says what is installed: nothing has changed the environment since.
    before = installed_state(prepared.target, plan.target_python)
    reasons = reinstall_reasons(plan, receipt, before)
    if not forced and not reasons:
        assert receipt is not None
        return InstallOutcome(plan, "up-to-date", receipt, None)
    if receipt is not None and receipt.cache_key == plan.cache_key and reasons:
        output.warn("the installed DeepSpeed is not what was installed: " + "; ".join(reasons) + "; reinstalling")
    built = build_wheel(plan, prepared.recipe, prepared.spec, cache, os.environ, force=request.rebuild,
                        progress=progress, status=output.status)
    output.status(("reusing cached wheel " if built.cached else f"built in {built.seconds:.0f} s: ")
                  + built.wheel.name)
    new_receipt = install_wheel(plan, built, prefix, status=output.status, warn=output.warn,
                                replace_bad_receipt=forced, before=before)
    report = None
    if request.verify:
        output.status("verifying the install (mlstack-ds verify)")
        # torch was held and checked unchanged by install_wheel: detect's torch facts still hold.
        report = run_verify(VerifyOptions(python=Path(plan.target_python), target=prepared.target),
                            status=output.status)
    return InstallOutcome(plan, "installed", new_receipt, built, report)

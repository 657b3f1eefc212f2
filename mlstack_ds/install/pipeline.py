"""The install pipeline: detect -> plan -> (dry run stops here) -> build -> install -> verify.

One function per user-visible command; the CLI only parses options and renders what comes back.
The target interpreter is probed once by detect (`Prepared.target`); `run_install` judges the installed
state from that answer and hands it to verify, and probes again only after pip changed the environment.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.build.wheel import BuildProgress, BuiltWheel, build_wheel, cached_wheel
from mlstack_ds.bundle.manifest import read_manifest
from mlstack_ds.bundle.offline import OfflineBundle, check_offline, here, pip_env
from mlstack_ds.console import Output
from mlstack_ds.detect import Environment
from mlstack_ds.detect.environment import detect_with_target
from mlstack_ds.detect.host import cpu_flags
from mlstack_ds.detect.target_probe import TargetFacts
from mlstack_ds.detect.toolchain import probe_toolchain
from mlstack_ds.errors import EnvironmentProblem, InstallError, UsageError
from mlstack_ds.index.choose import IndexChoice, adopt, choose, fetch_verified
from mlstack_ds.index.match import Here
from mlstack_ds.install.repair import scrub_interrupted
from mlstack_ds.install.wheel import install_wheel
from mlstack_ds.installed.health import InstalledState, check_health, installed_state, probe_installed
from mlstack_ds.installed.journal import lift_guard, read_journal
from mlstack_ds.installed.lock import target_lock
from mlstack_ds.installed.receipt import Receipt, ReceiptError, read_receipt
from mlstack_ds.patches import series_for_recipe
from mlstack_ds.plan.buildjobs import read_mem_available
from mlstack_ds.plan.buildplan import BuildPlan, plan_differences
from mlstack_ds.plan.planner import plan_build
from mlstack_ds.plan.targets import parse_arch_option
from mlstack_ds.recipe import Recipe, find_recipe
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import SourceSpec, check_local_source, parse_source_spec
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
    # `install --hostfile` on each node: install the head's wheel (this cache key) from the cache, never build.
    cached_wheel: str | None = None
    # Seconds to wait for another install into the same environment (None: until it ends; 0: refuse at once).
    lock_timeout: float | None = None
    # `install --index`: a package index (URL or directory) to take a prebuilt wheel from; `index_only`
    # refuses to build when none fits.
    index: str | None = None
    index_only: bool = False
    # `install --offline DIR`: a bundle (`mlstack-ds bundle`) is the only source: its sdist, pip held to it.
    offline: Path | None = None


@dataclass(frozen=True)
class Prepared:
    environment: Environment
    recipe: Recipe
    spec: SourceSpec
    plan: BuildPlan  # with --index and a fitting wheel: that wheel's plan (index/choose.adopt)
    target: TargetFacts  # detect's answer from the target interpreter, reused instead of asking again
    index: IndexChoice | None = None  # what the index offered and chose (--index)
    offline: OfflineBundle | None = None  # the bundle checked to cover this install (--offline)


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


def prepare(request: InstallRequest) -> Prepared:
    """Everything up to the plan; touches nothing (this is `install --dry-run`)."""
    if request.jobs is not None and request.jobs < 1:
        raise UsageError(f"--jobs {request.jobs}: must be at least 1", hint="e.g. --jobs 4")
    recipe = find_recipe(request.deepspeed_version)  # a version ("0.19.5"), a recipe's name or its file
    spec = parse_source_spec(request.source, git_url=request.git_url, git_commit=request.git_commit,
                             sha256=request.sha256)
    if request.offline is None:
        check_local_source(spec)
    else:
        read_manifest(request.offline)  # not a bundle at all: said at once, before detect starts the target
    archs = parse_arch_option(request.archs) if request.archs is not None else None
    detection = detect_with_target(python=request.python)
    environment = detection.environment
    offline = None
    source_label = request.source
    if request.offline is not None:  # checked before anything changes; the sdist is then the bundle's
        series = [(p.name, p.sha256) for p in series_for_recipe(recipe).patches] if request.patches else []
        offline = check_offline(request.offline, recipe, series, here(environment.python.version))
        spec = parse_source_spec(str(offline.sdist))
        source_label = f"offline:{offline.directory}"
    rocm_root = Path(environment.rocm.root) if environment.rocm and environment.rocm.root else None
    toolchain = probe_toolchain(os.environ, rocm_root, environment.python.include_dir,
                                rocm_first=environment.rocm is not None and environment.rocm.kind == "wheels")
    # A bundle with prebuilt DeepSpeed wheels (`bundle --prebuilt`, `publish --to DIR`) is an index as well: one
    # that fits is installed as `--index` would, else the bundle's sdist is built.
    index = request.index if offline is None or not offline.has_prebuilt() else str(offline.directory)
    if offline is not None and index is None and request.index_only:
        raise InstallError(f"--index-only: the bundle in {offline.directory} has no prebuilt DeepSpeed wheel; nothing "
                           "was installed", hint="add one where it was built (mlstack-ds bundle --prebuilt KEY, or "
                           "publish KEY --to DIR), or leave out --index-only to build from the bundle's sdist")
    plan = plan_build(environment, recipe, spec, toolchain, archs=archs, jobs=request.jobs,
                      patches=request.patches, source_label=source_label, mem_available=read_mem_available(),
                      toolchain_optional=index is not None,
                      offline_simple=offline.simple if offline is not None else None)
    choice = None
    if index is not None:
        choice = choose(index, Here(plan.to_dict(), platform.machine(), cpu_flags()))
        plan = refuse_or_adopt(plan, choice, index_only=request.index_only)
    return Prepared(environment, recipe, spec, plan, detection.target, choice, offline)


def refuse_or_adopt(plan: BuildPlan, choice: IndexChoice, *, index_only: bool) -> BuildPlan:
    """The plan of the index's fitting wheel; else this machine's plan, to build here (when it can), with
    the reasons each candidate did not fit in the refusal."""
    if choice.chosen is not None:
        return adopt(plan, choice.chosen)
    why = choice.why_not()
    if index_only:
        raise InstallError(f"no wheel in the index {choice.index.spec} fits this machine: {why}; nothing was "
                           "installed", hint="publish one built for this machine (mlstack-ds build + publish), or "
                           "leave out --index-only to build here")
    if plan.toolchain_missing:
        message, hint = plan.toolchain_missing[0]
        raise EnvironmentProblem(f"{message}, and no wheel in the index {choice.index.spec} fits this machine "
                                 f"({why})", hint=hint)
    return plan


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


def refuse_to_build(plan: BuildPlan, expected_key: str, cache: Cache) -> None:
    """A node of `install --hostfile` installs the head's wheel or nothing: compiling there would give
    the nodes different builds. A plan that differs from the head's (other torch, Python, toolchain, op
    decisions) is named field by field, from the head's plan recorded with the wheel in the cache."""
    if plan.cache_key != expected_key:
        differences = plan_differences(plan.to_dict(), _recorded_plan(cache, expected_key))
        raise InstallError(
            f"this node plans another build than the head ({plan.cache_key}, not {expected_key})"
            + (": " + "; ".join(differences) if differences else ""),
            hint="every node needs the same torch, Python and build tools as the host that built the wheel "
            "(compare `mlstack-ds install --dry-run` on both)")
    if cached_wheel(cache, plan) is None:
        raise InstallError(f"no cached wheel for plan {expected_key} in {cache.root}",
                           hint="the head copies it there first; run `mlstack-ds install --hostfile` again")


def _recorded_plan(cache: Cache, key: str) -> dict[str, Any] | None:
    """The plan the head recorded next to its wheel (build.json), if this node's cache has the entry."""
    try:
        data = json.loads((cache.root / "wheels" / key / "build.json").read_text())
    except (OSError, ValueError):
        return None
    plan = data.get("plan") if isinstance(data, dict) else None
    return plan if isinstance(plan, dict) else None


def _index_wheel(choice: IndexChoice, cache: Cache, output: Output) -> BuiltWheel:
    """The chosen index wheel, downloaded into the cache (kept by its sha256) and checked through
    (index/choose.fetch_verified) before pip sees it."""
    assert choice.chosen is not None
    started = time.monotonic()
    output.status(f"fetching {choice.chosen.link.filename} from the index {choice.index.spec}")
    fetched = fetch_verified(choice, cache.root / "index")
    output.status(f"checked {fetched.path.name}: sha256, every file against its RECORD, its ops and torch against "
                  "its plan")
    return BuiltWheel(fetched.path, fetched.sha256, str(fetched.published.get("source_commit") or ""),
                      str(fetched.published.get("tree_hash") or ""), True, None, time.monotonic() - started)


def run_install(prepared: Prepared, request: InstallRequest, output: Output,
                progress: BuildProgress | None = None) -> InstallOutcome:
    """Everything from the receipt to the new receipt runs under the environment's lock: a second install
    into the same interpreter waits (and says so), then finds the first one's result. An earlier change
    that was killed (its journal is there, and its lock is free) is repaired: what it left is cleared and
    the plan's wheel installed."""
    plan = prepared.plan
    prefix = prepared.environment.python.prefix
    if not prefix:
        raise EnvironmentProblem(f"cannot tell the environment prefix of {plan.target_python}",
                                 hint="check that --python runs")
    cache = Cache.open(request.cache_dir)  # a bad --cache-dir is an error even when nothing needs building
    if request.cached_wheel is not None:
        refuse_to_build(plan, request.cached_wheel, cache)
    site_dirs = prepared.target.python.site_packages
    with target_lock(prefix, plan.target_python, timeout_s=request.lock_timeout, waiting=output.warn) as lock:
        interrupted = read_journal(prefix)
        if interrupted is not None:
            lift_guard(interrupted, site_dirs)
            removed = scrub_interrupted(site_dirs)
            output.warn(f"{interrupted.describe()} was interrupted; repairing: installing DeepSpeed "
                        f"{plan.deepspeed_version}" + (f" (removed what it left: {', '.join(removed)})"
                                                       if removed else ""))
        forced = request.force or request.rebuild or interrupted is not None
        try:
            receipt = read_receipt(prefix)
        except ReceiptError:
            if not forced:  # its hint: --force replaces it
                raise
            receipt = None  # install_wheel warns about it and writes a new one
        # detect's probe, moments ago, says what is installed, unless another change ran meanwhile.
        before = (probe_installed(plan.target_python) if lock.waited or interrupted is not None
                  else installed_state(prepared.target, plan.target_python))
        reasons = reinstall_reasons(plan, receipt, before)
        if not forced and not reasons:
            assert receipt is not None
            return InstallOutcome(plan, "up-to-date", receipt, None)
        if interrupted is None and receipt is not None and receipt.cache_key == plan.cache_key and reasons:
            output.warn("the installed DeepSpeed is not what was installed: " + "; ".join(reasons)
                        + "; reinstalling")
        if prepared.index is not None and prepared.index.chosen is not None:
            built = _index_wheel(prepared.index, cache, output)
        else:
            built = build_wheel(plan, prepared.recipe, prepared.spec, cache, os.environ, force=request.rebuild,
                                progress=progress, status=output.status)
            output.status(("reusing cached wheel " if built.cached else f"built in {built.seconds:.0f} s: ")
                          + built.wheel.name)
        offline = prepared.offline
        new_receipt = install_wheel(plan, built, prefix, status=output.status, warn=output.warn,
                                    replace_bad_receipt=forced, before=before, lock=lock, interrupted=interrupted,
                                    origin=plan.prebuilt, pip_source=(offline.pip_args(), pip_env(os.environ))
                                    if offline is not None else None)
    report = None
    if request.verify:
        output.status("verifying the install (mlstack-ds verify)")
        # torch was held and checked unchanged by install_wheel: detect's torch facts still hold.
        report = run_verify(VerifyOptions(python=Path(plan.target_python), target=prepared.target),
                            status=output.status)
    return InstallOutcome(plan, "installed", new_receipt, built, report)

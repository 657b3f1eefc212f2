"""Turn what was detected + the recipe + the user's options into a `BuildPlan` (pure, no I/O).

`install --dry-run` prints exactly this; the build and install stages only execute it. Everything
that decides *what* gets built lives here, so it can be tested table-driven on replayed machines.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from mlstack_ds.detect.model import Environment, RocmWheels
from mlstack_ds.detect.toolchain import CXX_FIX, HIPCC_FIX, LIBAIO_FIX, PYTHON_HEADERS_FIX, Toolchain, hint_from
from mlstack_ds.detect.versions import hip_names_rocm, major_minor
from mlstack_ds.detect.wheel_builder import fix_package
from mlstack_ds.errors import EnvironmentProblem, UsageError
from mlstack_ds.plan import buildspec
from mlstack_ds.plan.buildjobs import BuildConcurrency, plan_concurrency
from mlstack_ds.plan.targets import (
    refuse_cuda_suffixes,
    refuse_targets_torch_lacks,
    select_cuda_targets,
    select_rocm_targets,
)

PLAN_SCHEMA = 1
# How many compiles run at once, and whether they go through ccache, change how fast the wheel is built,
# not what is in it: these variables are not part of the cache key, and nodes that differ only in them
# share a wheel.
CONCURRENCY_VARIABLES = frozenset({"MAX_JOBS", "DS_ENABLE_NINJA", "HIPCC_COMPILE_FLAGS_APPEND", "PYTORCH_NVCC"})
# The patch that makes setuptools' parallel build_ext safe (one build directory per op); without it in
# the series the ops build one after another.
PARALLEL_OPS_PATCH = "setup-one-build-dir-per-op.patch"
# The patch that teaches DeepSpeed's op builder the arch- and family-specific CUDA targets (`9.0a`, `10.0f`):
# without it `compute_capability_args` reads the minor version with int() and every CUDA op fails to build.
CUDA_ARCH_SUFFIX_PATCH = "op_builder-CUDA-arch-variant-suffixes.patch"


@dataclass(frozen=True)
class PlanOptions:
    source: str = "pypi"
    archs: tuple[str, ...] | None = None
    jobs: int | None = None
    patches: bool = True
    source_pin: str | None = None  # what the build will use (source.fetch.source_pin); None: the recipe's
    source_notes: tuple[str, ...] = ()  # what the plan says about that source (a dirty checkout, ...)
    # `install --index`: a prebuilt wheel may make the compilers unnecessary, so a missing one is recorded in
    # `BuildPlan.toolchain_missing` (and raised only if the plan must be built here) instead of refused now.
    toolchain_optional: bool = False
    # `install --offline DIR`: where the bundle's wheels are (DIR/simple), so a fix that installs a package says
    # to take it from there; None: from the user's index.
    offline_simple: Path | None = None


@dataclass(frozen=True)
class PatchRef:
    name: str
    sha256: str


@dataclass(frozen=True)
class OpDecision:
    name: str
    flag: str
    build: bool
    reason: str


@dataclass(frozen=True)
class BuildPlan:
    schema: int
    recipe: str
    deepspeed_version: str
    source: str
    source_pin: str  # what the tree must be: a commit, an archive's sha256, <commit>+dirty.<digest> of a
    # checkout's working tree, or tree:<digest> of a directory
    patches: tuple[PatchRef, ...]
    platform: str
    accelerator: str
    archs: tuple[str, ...]
    wavefront: int | None
    ops: tuple[OpDecision, ...]
    env: dict[str, str]
    path_prepend: tuple[str, ...]
    target_python: str
    python_version: str
    torch_version: str
    cache_key: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    targets_source: str = ""  # "flag" (--arch), "environment" (PYTORCH_ROCM_ARCH, TORCH_CUDA_ARCH_LIST), "detected"
    concurrency: BuildConcurrency | None = None  # compiles at once (buildjobs); None: one op at a time
    torch_hip: str | None = None  # the ROCm torch's HIP version: a wheel's ops are built against it
    torch_cuda: str | None = None
    rocm_wheels: str | None = None  # the version of TheRock's ROCm wheels the ops are built against
    rocm_version: str | None = None  # ROCm major.minor of this machine (a published wheel's is matched on it)
    # What building here lacks, as (message, hint), when `PlanOptions.toolchain_optional`: empty otherwise.
    toolchain_missing: tuple[tuple[str, str], ...] = ()
    prebuilt: str | None = None  # the URL of the index wheel installed instead of building (install --index)

    @property
    def built_ops(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops if op.build)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["built_ops"] = list(self.built_ops)
        return data


def pip_install_hint(python: str, package: str, offline_simple: Path | None) -> str:
    """The pip command that installs `package` into `python`: from the bundle (`offline_simple`, its wheels'
    directory) with nothing else, on an air-gapped machine; from the user's index otherwise."""
    if offline_simple is None:
        return f"{python} -m pip install {package}"
    return f"{python} -m pip install --no-index --find-links {offline_simple / package} {package}"


def make_plan(
    environment: Environment,
    recipe: Any,
    toolchain: Toolchain,
    patches: Sequence[PatchRef],
    options: PlanOptions,
    *,
    cpu_count: int | None = None,
    mem_available: int | None = None,
) -> BuildPlan:
    """Decide the whole build, or refuse early with the fix in the message."""
    torch = environment.torch
    platform = environment.platform
    _refuse_wrong_torch(environment)
    assert torch is not None
    table = recipe.platforms.get(platform)
    if table is None:
        raise UsageError(f"recipe {recipe.name} has no build table for platform {platform!r}",
                         hint="use a recipe that supports this platform")
    build = buildspec.parse_platform(platform, table, str(recipe.path))
    notes: list[str] = list(options.source_notes)

    env: dict[str, str] = {"DS_ACCELERATOR": build.accelerator, "DS_BUILD_OPS": "0"}
    archs: tuple[str, ...] = ()
    wavefront: int | None = None
    targets_source = ""
    rocm_wheels: str | None = None
    toolchain_problems: list[EnvironmentProblem] = []
    if options.archs and platform != "rocm":
        raise UsageError(f"--arch applies to ROCm builds; this is a {platform} machine",
                         hint="leave out --arch")
    if platform == "rocm":
        _refuse_old_rocm(environment, recipe.min_rocm)
        targets = select_rocm_targets(environment, options.archs)
        archs, wavefront, targets_source = targets.archs, targets.wavefront, targets.source
        notes.extend(targets.notes)
        unchecked = refuse_targets_torch_lacks(archs, torch)
        if unchecked:
            notes.append(unchecked)
        env["PYTORCH_ROCM_ARCH"] = ";".join(archs)
        env["DS_ROCM_WAVEFRONT_SIZE"] = str(wavefront)
        wheels = environment.rocm_wheels if environment.rocm and environment.rocm.kind == "wheels" else None
        if wheels is not None:
            devel_root = _require_rocm_devel(wheels, environment.python.executable)
            # torch's cpp_extension guesses ROCM_HOME from `which hipcc` (the venv's trampoline: the venv
            # root) or `_rocm_sdk_core` without pytorch#196503; both fail to link or compile. Named here.
            env["ROCM_HOME"] = env["ROCM_PATH"] = devel_root
            rocm_wheels = wheels.version
            notes.append(f"ROCm {wheels.version} from the target's wheels: ROCM_HOME=ROCM_PATH={devel_root}")
        elif environment.rocm and environment.rocm.root:
            env["ROCM_HOME"] = environment.rocm.root
        if not toolchain.hipcc:
            toolchain_problems.append(EnvironmentProblem("hipcc not found (needed to compile the ROCm ops)",
                                                         hint=hint_from(HIPCC_FIX)))
    elif platform == "cuda":
        cuda_targets = select_cuda_targets(environment)
        archs, targets_source = cuda_targets.archs, cuda_targets.source
        notes.extend(cuda_targets.notes)
        if archs:
            refuse_cuda_suffixes(archs, recipe.version, patched=options.patches and any(
                p.name.endswith(CUDA_ARCH_SUFFIX_PATCH) for p in patches))
            env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
        if not toolchain.nvcc:
            toolchain_problems.append(EnvironmentProblem(
                "nvcc not found (needed to compile the CUDA ops)",
                hint="install the CUDA toolkit matching torch, or set CUDA_HOME"))
    if toolchain.python_headers is False:
        toolchain_problems.append(EnvironmentProblem(
            f"Python headers (Python.h) missing for {environment.python.executable}",
            hint=hint_from(PYTHON_HEADERS_FIX)))
    cannot_build_wheels = environment.python.wheel_build_problem
    if cannot_build_wheels:
        python = environment.python.executable
        toolchain_problems.append(EnvironmentProblem(
            f"{python} cannot build DeepSpeed's wheel: {cannot_build_wheels}",
            hint=pip_install_hint(python, fix_package(environment.python.setuptools), options.offline_simple)))
    if not toolchain.cxx:
        named = environment.env.get("CXX")
        toolchain_problems.append(EnvironmentProblem(
            f"the C++ compiler CXX={named} is not found" if named else
            "no C++ compiler found (none of c++, g++, clang++ on PATH)", hint=hint_from(CXX_FIX)))
    missing = tuple((problem.message, problem.hint) for problem in toolchain_problems)
    if missing and not options.toolchain_optional:
        raise toolchain_problems[0]

    decisions = []
    for op in build.ops:
        on, reason = op.build, op.reason
        if on and op.requires == "libaio" and not toolchain.libaio_headers:
            on, reason = False, f"skipped: libaio headers not found ({hint_from(LIBAIO_FIX)})"
        decisions.append(OpDecision(op.name, op.flag, on, reason))
        env[op.flag] = "1" if on else "0"
    source_pin = options.source_pin or (
        (recipe.git.commit or "git:unpinned") if options.source == "git" else recipe.sdist.sha256)
    patch_refs = tuple(patches) if options.patches else ()
    concurrency = _concurrency(options, toolchain, patch_refs, platform, decisions, archs=archs,
                               cpu_count=cpu_count, mem_available=mem_available, notes=notes)
    env["MAX_JOBS"] = str(concurrency.jobs_per_op)
    if toolchain.ninja:
        env["DS_ENABLE_NINJA"] = "1"  # DeepSpeed's setup.py compiles prebuilt ops without ninja otherwise
    if concurrency.archs_at_once > 1:
        env["HIPCC_COMPILE_FLAGS_APPEND"] = f"-parallel-jobs={concurrency.archs_at_once}"
    if platform == "rocm" and toolchain.ccache and toolchain.hipcc and "PYTORCH_NVCC" not in environment.env:
        # torch leaves hipcc out of its own ccache wrapping; PYTORCH_NVCC is its way to name the device
        # compiler command of ninja builds.
        env["PYTORCH_NVCC"] = f"{toolchain.ccache} {toolchain.hipcc}"
    path_prepend = (toolchain.ccache_dir,) if toolchain.ccache_dir else ()
    if rocm_wheels is not None and environment.rocm_wheels and environment.rocm_wheels.scripts_dir:
        path_prepend += (environment.rocm_wheels.scripts_dir,)  # the wheels' tools, activated or not
    plan = BuildPlan(
        schema=PLAN_SCHEMA, recipe=recipe.name, deepspeed_version=recipe.version, source=options.source,
        source_pin=source_pin, patches=patch_refs, platform=platform, accelerator=build.accelerator,
        archs=archs, wavefront=wavefront, ops=tuple(decisions), env=dict(sorted(env.items())),
        path_prepend=path_prepend, target_python=environment.python.executable,
        python_version=environment.python.version, torch_version=torch.version,
        cache_key="", notes=tuple(notes), targets_source=targets_source, concurrency=concurrency,
        torch_hip=torch.hip, torch_cuda=torch.cuda, rocm_wheels=rocm_wheels,
        rocm_version=rocm_major_minor(environment) if platform == "rocm" else None, toolchain_missing=missing,
    )
    return replace(plan, cache_key=cache_key(key_material(plan.to_dict())))


# How key_material's entries are named where a user reads them (plan_differences): as the plan's fields.
_KEY_LABELS = {"deepspeed": "deepspeed_version", "torch": "torch_version"}


def key_material(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache key is made of, from a plan's dict form (`BuildPlan.to_dict()`, or the head's plan
    recorded next to its wheel): everything that changes the wheel, nothing that does not (the compile
    concurrency, notes, paths, the kind of source: PyPI, a URL or a file with the same sha256 are one
    tree). One function, so the key and `plan_differences` cannot drift apart."""
    env = plan.get("env") if isinstance(plan.get("env"), Mapping) else {}
    # Only where it is set, so the keys of plans against a system ROCm (and their cached wheels) stay.
    wheels = {"rocm_wheels": plan["rocm_wheels"]} if plan.get("rocm_wheels") else {}
    return {**wheels,
        "schema": plan.get("schema"), "deepspeed": plan.get("deepspeed_version"),
        "source_pin": plan.get("source_pin"),
        "patches": [{"name": p.get("name"), "sha256": p.get("sha256")} for p in plan.get("patches") or ()
                    if isinstance(p, Mapping)],
        "platform": plan.get("platform"), "archs": list(plan.get("archs") or ()),
        "env": {k: v for k, v in env.items() if k not in CONCURRENCY_VARIABLES},
        "torch": plan.get("torch_version"), "torch_hip": plan.get("torch_hip"),
        "torch_cuda": plan.get("torch_cuda"), "python": major_minor(str(plan.get("python_version") or "")),
    }


def cache_key(material: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def plan_differences(here: Mapping[str, Any], head: Mapping[str, Any] | None) -> list[str]:
    """`what: X here, Y on the head` for each part of the key material that differs (env variables one by
    one); empty when the head's plan is unknown."""
    if head is None:
        return []

    def facts(plan: Mapping[str, Any]) -> dict[str, object]:
        material = key_material(plan)
        env = material.pop("env")
        out: dict[str, object] = {_KEY_LABELS.get(k, k): v for k, v in material.items()}
        out.update({f"env {k}": v for k, v in env.items()})
        # Compared in their JSON form: the plan here has tuples, the recorded one lists.
        return json.loads(json.dumps(out, default=str))

    mine, theirs = facts(here), facts(head)
    return [f"{key}: {_short(mine.get(key))} here, {_short(theirs.get(key))} on the head"
            for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def _concurrency(options: PlanOptions, toolchain: Toolchain, patch_refs: Sequence[PatchRef], platform: str,
                 decisions: Sequence[OpDecision], *, archs: Sequence[str], cpu_count: int | None,
                 mem_available: int | None, notes: list[str]) -> BuildConcurrency:
    """The compile budget split over ops/archs/sources; what limits it goes into the notes."""
    safe = bool(toolchain.ninja) and any(p.name.endswith(PARALLEL_OPS_PATCH) for p in patch_refs)
    built = sum(1 for op in decisions if op.build)
    concurrency = plan_concurrency(
        requested=options.jobs, cpus=cpu_count if cpu_count is not None else (os.cpu_count() or 1),
        mem_available=mem_available, platform=platform, ops=built, archs=len(archs), parallel_ops=safe)
    if not toolchain.ninja:
        notes.append("ninja not found: ops build one after another, one file at a time "
                     "(pip install ninja makes it faster)")
    elif not safe and built > 1:
        notes.append(f"ops build one after another: the series lacks *-{PARALLEL_OPS_PATCH}")
    if concurrency.warning:
        notes.append(concurrency.warning)
    return concurrency


def _refuse_wrong_torch(environment: Environment) -> None:
    torch, platform = environment.torch, environment.platform
    python = environment.python.executable
    if torch is None and environment.torch_problem:
        # Not "not installed": a broken import, or one stopped (it hung, or outlasted patience.WAITS["target probe"]).
        raise EnvironmentProblem(f"PyTorch could not be imported in {python}: {environment.torch_problem}",
                                 hint=f"run {python} -c 'import torch' to see why")
    if torch is None:
        hint = {
            "rocm": "install a ROCm PyTorch: pip install torch --index-url https://download.pytorch.org/whl/rocm"
            + (major_minor(environment.rocm.version) or "X.Y" if environment.rocm else "X.Y"),
            "cuda": "install a CUDA PyTorch: pip install torch (see pytorch.org for your CUDA version)",
            "cpu": "install a CPU PyTorch, e.g. scripts/install_deepspeed.sh --with-torch cpu",
        }[platform]
        raise EnvironmentProblem(f"PyTorch is not installed in {python}", hint=hint)
    if platform == "rocm" and torch.build != "rocm":
        raise EnvironmentProblem(
            f"this is an AMD GPU machine but {python} has a {torch.build.upper()} PyTorch ({torch.version})",
            hint="replace it with a ROCm build: pip install --force-reinstall torch --index-url "
            "https://download.pytorch.org/whl/rocm" + (major_minor(environment.rocm.version) or "X.Y"
                                                       if environment.rocm else "X.Y"),
        )
    if platform == "cuda" and torch.build != "cuda":
        raise EnvironmentProblem(
            f"this is an NVIDIA GPU machine but {python} has a {torch.build.upper()} PyTorch ({torch.version})",
            hint="install a CUDA build of PyTorch (pytorch.org)",
        )


def rocm_major_minor(environment: Environment) -> str | None:
    """The ROCm release the ops are compiled against, as major.minor: the wheels', the system's, else the
    HIP version torch names (when it names a ROCm release)."""
    if environment.rocm_wheels is not None and environment.rocm and environment.rocm.kind == "wheels":
        return major_minor(environment.rocm_wheels.version)
    if environment.rocm and environment.rocm.version:
        return major_minor(environment.rocm.version)
    hip = major_minor(environment.torch.hip) if environment.torch else None
    return hip if hip and hip_names_rocm(hip) else None


def _require_rocm_devel(wheels: RocmWheels, python: str) -> str:
    """The expanded devel tree of TheRock's wheels (headers, hipcc), or the refusal with the exact fix: the
    runtime wheels torch pulls in (`rocm[libraries]`) cannot compile anything."""
    scripts = Path(wheels.scripts_dir) if wheels.scripts_dir else Path(python).parent
    if not wheels.devel_installed:
        raise EnvironmentProblem(
            f"the target's ROCm {wheels.version} wheels have no development files (rocm[devel]): no hipcc, "
            "no headers to compile DeepSpeed's ops",
            hint=f'{python} -m pip install "rocm[devel]=={wheels.version}" from the index its torch came from '
            "(doctor MLS-ROCM-005)")
    if not wheels.devel_expanded or not wheels.devel_root:
        raise EnvironmentProblem(
            "the target's rocm[devel] is installed but not expanded yet (its headers and hipcc are still a "
            "tarball)", hint=f"{scripts / 'rocm-sdk'} init   # then run the install again")
    return wheels.devel_root


def _refuse_old_rocm(environment: Environment, min_rocm: str) -> None:
    rocm = environment.rocm
    hip = major_minor(environment.torch.hip) if environment.torch else None
    version = (rocm.version if rocm else None) or (hip if hip and hip_names_rocm(hip) else None)
    if not version:
        return
    try:
        too_old = Version(version) < Version(min_rocm)
    except InvalidVersion:
        return
    if too_old:
        raise EnvironmentProblem(
            f"ROCm {version} is older than this recipe supports (ROCm >= {min_rocm})",
            hint=f"upgrade ROCm to {min_rocm} or newer",
        )


def plan_env(plan: BuildPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The build's environment: the caller's, with the plan's variables and PATH additions on top."""
    env = {**base, **plan.env}
    appended = base.get("HIPCC_COMPILE_FLAGS_APPEND", "").strip()
    if appended and "HIPCC_COMPILE_FLAGS_APPEND" in plan.env:  # keep the user's own hipcc flags
        env["HIPCC_COMPILE_FLAGS_APPEND"] = f"{appended} {plan.env['HIPCC_COMPILE_FLAGS_APPEND']}"
    if plan.path_prepend:
        env["PATH"] = os.pathsep.join([*plan.path_prepend, base.get("PATH", "")])
    return env

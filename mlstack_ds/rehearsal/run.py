"""Rehearse a ROCm build on a machine without ROCm or a GPU: the real plan, the real `setup.py`.

The fake host (`machine.py`) stands in for ROCm and the GPU; everything of ours runs as in a real
install: `detect` on the fake host, `make_plan`, and the build stage's own fetch, patch and
wheel build. The compilers only record their command lines (`records.py`), so the result is the exact
set of compile lines a ROCm user's build would run, per op, and DeepSpeed's own record of what it
built. No device code is generated and no ROCm torch header is read: see docs/rocm-build-matrix.md.

The wheel made here is empty inside and must never meet a real wheel cache: the rehearsal builds
into a private cache and shares only the content-addressed download and source caches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from mlstack_ds.build.wheel import build_wheel
from mlstack_ds.detect import detect
from mlstack_ds.detect.toolchain import probe_toolchain
from mlstack_ds.errors import MlstackError
from mlstack_ds.installed.build_record import parse_git_version_info
from mlstack_ds.patience import WAITS
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.plan.planner import plan_build
from mlstack_ds.plan.targets import parse_arch_option
from mlstack_ds.recipe import Recipe
from mlstack_ds.rehearsal.machine import FakeHost, FakeTorch, RocmLayout, make_fake_host, standin_script
from mlstack_ds.rehearsal.records import OpBuild, Record, group_by_op, load_records
from mlstack_ds.rehearsal.therock import make_therock_venv
from mlstack_ds.runner import run
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import SourceSpec
from mlstack_ds.target_side import mlstack_purelib as purelib_module
from mlstack_ds.target_side import script

# Ops that cannot be built for ROCm (docs/rocm-ops.md): NVIDIA-only pieces (CUTLASS, dskernels, cuFile,
# PTX) or triton 1.x. A ROCm build must never attempt them.
NOT_FOR_ROCM = frozenset({"cutlass_ops", "ragged_device_ops", "inference_core_ops", "evoformer_attn", "gds",
                          "sparse_attn"})
# torch.version.hip of real ROCm wheels (sources: tests/fixtures/real/SOURCES.md), by ROCm release.
HIP_VERSIONS = {"6.0": "6.0.32830-d62f6a171", "6.1": "6.1.40092-038397aaa", "6.2": "6.2.41134-65d174c3e",
                "6.4": "6.4.43482-0f2d60242"}


# torch.version.hip of TheRock's releases: they number HIP apart from ROCm (rocm-as-python-wheels.md: ROCm 10.1
# reports HIP 7.16; 7.14 reports 7.14). Only the ROCm release is what the plan reads.
# ROCm 10.0's HIP number is not documented: 7.15 is assumed (between 7.14's and 10.1's); DeepSpeed's setup.py
# parses it as numbers, nothing of ours reads it.
THEROCK_HIP_VERSIONS = {"7.14": "7.14.0-rehearsal", "10.0": "7.15.0-rehearsal-assumed", "10.1": "7.16.0-rehearsal"}


def therock_hip_version(rocm: str) -> str:
    return THEROCK_HIP_VERSIONS[".".join(rocm.split(".")[:2])]


def hip_version_for(rocm: str) -> str:
    """torch.version.hip for a ROCm release: a real string where one is known, else `X.Y.0-rehearsal`."""
    major_minor = ".".join(rocm.split(".")[:2])
    return HIP_VERSIONS.get(major_minor, f"{major_minor}.0-rehearsal")


def header_minimum_standard(torch_version: str) -> str:
    """The oldest C++ standard this torch's headers accept: C++20 from torch 2.14 (pytorch#178150 put it
    in the header guards), C++17 before (docs/patches.md, 0015, has the evidence per release)."""
    return "c++20" if _release(torch_version) >= (2, 14) else "c++17"


def extension_standard(torch_version: str) -> str:
    """The standard this torch builds extensions with, and so DeepSpeed's flags must carry: C++20 from
    2.12 (cpp_extension since pytorch#176659; DeepSpeed's cxx_args() since #8238), C++17 before."""
    return "c++20" if _release(torch_version) >= (2, 12) else "c++17"


def _release(torch_version: str) -> tuple[int, ...]:
    return Version(torch_version.split("+", 1)[0]).release[:2]


def standard_year(std: str) -> int:
    """`c++17`/`gnu++17` -> 17, `c++2a` -> 20, `c++20` -> 20; unknown -> 0 (never new enough)."""
    value = std.rsplit("+", 1)[-1].lower()
    aliases = {"1z": 17, "2a": 20, "2b": 23, "2c": 26}
    if value in aliases:
        return aliases[value]
    return int(value) if value.isdigit() else 0


@dataclass(frozen=True)
class RehearsalSpec:
    name: str
    rocminfo: str  # the text a real rocminfo printed on the machine
    rocminfo_exit: int = 0
    rocm_version: str = "6.4.1"
    rocm_layout: RocmLayout = "opt"  # "distro": packaged ROCm without .info/version, and a packaged torch
    torch_version: str = "2.13.0"  # the ROCm torch release the shim reports ("+rocmX.Y" is added)
    torch_build: str = "rocm"  # "cpu" or "cuda" rehearse the wrong torch on a ROCm host
    torch_archs: tuple[str, ...] | None = None  # archs the ROCm torch was built for; None: not known
    archs: str | None = None  # `install --arch`
    user_env: Mapping[str, str] = field(default_factory=dict)  # e.g. PYTORCH_ROCM_ARCH
    patches: bool = True
    all_ops: bool = False  # DS_BUILD_OPS=1, as the upstream docs suggest, instead of the plan's op list
    syntax_hipcc: str | None = None  # Debian's hipcc: also syntax-check each hipified translation unit
    syntax_stubs: str | None = None  # device-side stub headers for that check (tests/patches/hip/stub)
    # ROCm as TheRock's Python wheels in the build venv (no ROCm root on the host): the venv's devel tree has
    # the recording hipcc, its rocminfo replays `rocminfo` (fails when rocminfo_exit != 0), and torch's own
    # ROCM_HOME guess, when the environment names none, is the venv root (torch without pytorch#196503)
    # or the devel tree (with it).
    rocm_wheels: bool = False
    rocm_guess: str = "devel"  # "venv-root" | "devel"

    @property
    def fake_torch(self) -> FakeTorch:
        arch_flags = " ".join(self.torch_archs) if self.torch_archs is not None else None
        if self.torch_build == "cpu":
            return FakeTorch(version=f"{self.torch_version}+cpu", hip=None, arch_flags=None)
        if self.torch_build == "cuda":
            return FakeTorch(version=f"{self.torch_version}+cu126", hip=None, cuda="12.6", arch_flags=arch_flags)
        if self.rocm_wheels:  # TheRock's torch wheels carry the whole ROCm version: 2.14.1+rocm7.14.0
            return FakeTorch(version=f"{self.torch_version}+rocm{self.rocm_version}",
                             hip=therock_hip_version(self.rocm_version), arch_flags=arch_flags)
        if self.rocm_layout == "core":  # the new stream's system packages, with a torch built for them
            return FakeTorch(version=f"{self.torch_version}+rocm{self.rocm_version}",
                             hip=therock_hip_version(self.rocm_version), arch_flags=arch_flags)
        rocm = ".".join(self.rocm_version.split(".")[:2])
        # A distribution's torch package (Fedora, Debian) carries no `+rocmX.Y` tag in its version, which
        # is one of the places 0.19.5's installed_rocm_version() looks; PyTorch's wheels do.
        local = "" if self.rocm_layout == "distro" else f"+rocm{rocm}"
        return FakeTorch(version=f"{self.torch_version}{local}", hip=hip_version_for(self.rocm_version),
                         arch_flags=arch_flags)


@dataclass
class RehearsalResult:
    spec: RehearsalSpec
    outcome: str  # "built" | "refused" (the plan said no) | "build-failed"
    seconds: float
    plan: BuildPlan | None = None
    error: str | None = None
    hint: str | None = None
    exit_code: int | None = None
    installed_ops: dict[str, Any] = field(default_factory=dict)
    ops: dict[str, OpBuild] = field(default_factory=dict)
    orphans: list[Record] = field(default_factory=list)
    log_tail: str = ""

    @property
    def required_std(self) -> str:
        return header_minimum_standard(self.spec.torch_version)

    @property
    def extension_std(self) -> str:
        return extension_standard(self.spec.torch_version)

    def to_dict(self) -> dict[str, Any]:
        spec = dataclasses.asdict(self.spec)
        spec.pop("rocminfo")
        plan = self.plan
        return {
            "name": self.spec.name, "spec": spec, "outcome": self.outcome, "seconds": round(self.seconds, 1),
            "error": self.error, "hint": self.hint, "exit_code": self.exit_code,
            "plan": None if plan is None else {
                "archs": list(plan.archs), "wavefront": plan.wavefront, "built_ops": list(plan.built_ops),
                "env": plan.env, "notes": list(plan.notes), "targets_source": plan.targets_source},
            "required_std": self.required_std,
            "extension_std": self.extension_std,
            "installed_ops": self.installed_ops,
            "ops": {name: {"extension": op.extension,
                           "compile": [list(r.argv) for r in op.compiles],
                           "syntax": {Path(r.source or r.output).name: r.syntax for r in op.compiles if r.syntax},
                           "link": list(op.link.argv) if op.link else None}
                    for name, op in self.ops.items()},
            "violations": violations(self),
        }


def rehearse(spec: RehearsalSpec, recipe: Recipe, source: SourceSpec, *, python: Path,
             fetch_cache: Path, base_environ: Mapping[str, str] | None = None,
             status: Callable[[str], None] = lambda _m: None) -> RehearsalResult:
    """Plan and build `spec`'s machine for real, compilers recording; never raises for the build's verdict."""
    started = time.monotonic()
    base = dict(os.environ if base_environ is None else base_environ)
    with tempfile.TemporaryDirectory(prefix="mlstack-rehearsal-") as work:
        root = Path(work)
        cache = _private_cache(root / "cache", fetch_cache)
        host = make_fake_host(root / "host", rocminfo=spec.rocminfo, rocminfo_exit=spec.rocminfo_exit,
                              rocm_version=spec.rocm_version, hip_version=hip_version_for(spec.rocm_version),
                              layout=spec.rocm_layout, torch=spec.fake_torch,
                              tree_mark=cache.root / "tmp", user_env=dict(spec.user_env), base_environ=base)
        if spec.syntax_hipcc:
            host.environ["MLSTACK_REHEARSAL_SYNTAX_HIPCC"] = spec.syntax_hipcc
            host.environ["MLSTACK_REHEARSAL_SYNTAX_STUBS"] = spec.syntax_stubs or ""
        if spec.rocm_wheels:
            python = _wheels_venv(spec, root / "venv", python, host)
        result = RehearsalResult(spec, "refused", 0.0)
        try:
            status(f"{spec.name}: planning")
            plan = _plan(spec, recipe, source, python=python, environ=host.environ, rocm_root=host.rocm_root,
                         opt_rocm=host.opt_rocm)
            result.plan = plan
            status(f"{spec.name}: building {', '.join(plan.built_ops)} for {', '.join(plan.archs)}")
            result.outcome = "build-failed"
            built = build_wheel(plan, recipe, source, cache, host.environ, status=status)
            result.outcome = "built"
            result.installed_ops = _installed_ops(built.wheel)
        except MlstackError as exc:
            result.error, result.hint, result.exit_code = exc.message, exc.hint, exc.exit_code
            result.log_tail = _log_tail(cache.root / "logs")
        result.ops, result.orphans = group_by_op(load_records(host.records))
        result.seconds = time.monotonic() - started
        return result


def _wheels_venv(spec: RehearsalSpec, root: Path, python: Path, host: FakeHost) -> Path:
    """The build venv of a ROCm-wheels row, on a host that has no ROCm root of its own; its interpreter."""
    site = run([python, script(purelib_module)], patience=WAITS["target probe"]).stdout.strip()
    torch = spec.fake_torch
    venv = make_therock_venv(root, rocm_version=spec.rocm_version, torch_version=torch.version,
                             hip_version=torch.hip or "", arch_flags=torch.arch_flags or "",
                             devices=tuple(spec.archs.split(",")) if spec.archs else (),
                             rocminfo=spec.rocminfo if spec.rocminfo_exit == 0 else None,
                             hipcc=standin_script(), base_python=str(python), real_torch_site=Path(site))
    host.environ.pop("ROCM_PATH", None)
    host.environ["PATH"] = os.pathsep.join(p for p in host.environ["PATH"].split(os.pathsep)
                                           if p != str(host.rocm_root / "bin"))
    host.environ["MLSTACK_REHEARSAL_ROCM_GUESS"] = str(venv.root if spec.rocm_guess == "venv-root"
                                                       else venv.devel_root)
    return venv.python


def _plan(spec: RehearsalSpec, recipe: Recipe, source: SourceSpec, *, python: Path, environ: dict[str, str],
          rocm_root: Path, opt_rocm: Path) -> BuildPlan:
    environment = detect(environ=environ, python=python, rocm_default=opt_rocm)
    rocm = environment.rocm
    wheels = rocm is not None and rocm.kind == "wheels" and rocm.root is not None
    toolchain = probe_toolchain(environ, Path(rocm.root) if wheels and rocm and rocm.root else rocm_root,
                                environment.python.include_dir, rocm_first=wheels)
    # The fake host has no ccache: its masquerade links would put a real cache in front of the stand-ins.
    toolchain = dataclasses.replace(toolchain, ccache_dir=None, ccache=None)
    archs = parse_arch_option(spec.archs) if spec.archs is not None else None
    plan = plan_build(environment, recipe, source, toolchain, archs=archs, patches=spec.patches)
    if spec.all_ops:  # what the upstream docs suggest: every op DeepSpeed thinks it can build
        env = {k: v for k, v in plan.env.items() if not k.startswith("DS_BUILD_")}
        plan = dataclasses.replace(plan, env={**env, "DS_BUILD_OPS": "1"})
    return plan


def _private_cache(root: Path, fetch_cache: Path) -> Cache:
    """Wheels and logs of its own; downloads and imported sources shared (content-addressed, safe)."""
    root.mkdir(parents=True)
    shared = Cache.open(fetch_cache)
    for sub in ("downloads", "repos"):
        (root / sub).symlink_to(shared.root / sub, target_is_directory=True)
    return Cache.open(root)


def _installed_ops(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("deepspeed/git_version_info_installed.py").decode()
    ops = parse_git_version_info(text).get("installed_ops")
    return dict(ops) if isinstance(ops, dict) else {}


def _log_tail(logs: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError, StopIteration):
        log = next(iter(sorted(logs.glob("build-*.log"))))
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def violations(result: RehearsalResult) -> list[str]:
    """Everything that a real ROCm build of this plan would get wrong, one line each; [] when sound."""
    if result.outcome != "built" or result.plan is None:
        return []
    plan = result.plan
    problems: list[str] = []
    built = set(result.ops)
    installed = {name for name, on in result.installed_ops.items() if on}
    if built != set(plan.built_ops) and not result.spec.all_ops:  # DS_BUILD_OPS=1: DeepSpeed chooses
        problems.append(f"ops compiled {sorted(built)} != planned {sorted(plan.built_ops)}")
    if installed != built:
        problems.append(f"DeepSpeed recorded installed_ops {sorted(installed)} != compiled {sorted(built)}")
    for name in sorted(built & NOT_FOR_ROCM):
        problems.append(f"{name}: an op that cannot be built for ROCm was attempted")
    for record in result.orphans:
        problems.append(f"compile of {record.source} belongs to no op")
    for name, op in result.ops.items():
        if not op.compiles:
            problems.append(f"{name}: linked without compiling anything")
        for record in op.compiles:
            where = f"{name}: {Path(record.source or record.output).name}"
            std = record.std[-1] if record.std else "(none)"
            if standard_year(std) < standard_year(result.required_std):
                problems.append(f"{where}: -std={std}, but torch {result.spec.torch_version}'s headers need "
                                f"-std={result.required_std} or newer")
            elif deepspeed_chose_standard(record) and std != result.extension_std:
                problems.append(f"{where}: DeepSpeed gives -std={std}, but torch {result.spec.torch_version} "
                                f"builds extensions (and DeepSpeed's host compiles) as -std={result.extension_std}")
            if not record.is_hip:
                continue
            if sorted(record.offload_archs) != sorted(plan.archs) or len(set(record.offload_archs)) != len(
                    record.offload_archs):
                problems.append(f"{where}: --offload-arch {list(record.offload_archs)} != plan {list(plan.archs)}")
            if set(record.wavefront_defines) != {plan.wavefront}:
                problems.append(f"{where}: ROCM_WAVEFRONT_SIZE {list(record.wavefront_defines)} != {plan.wavefront}")
            devel_include = f"-I{plan.env.get('ROCM_HOME')}/include"
            if result.spec.rocm_wheels and devel_include not in record.argv:
                problems.append(f"{where}: compiled without the wheels' devel headers ({devel_include})")
    return problems


def deepspeed_chose_standard(record: Record) -> bool:
    """Whether the -std on this line is DeepSpeed's own choice, not torch's default. torch's
    cpp_extension appends its `-std=` to the very end of the flags, and only when none is there; DeepSpeed's
    flags come earlier (torch's own `-DTORCH_EXTENSION_NAME=` defines follow them). So: a -std that is not
    the last argument. fused_adam/lamb/lion (hipcc), utils and pin_memory pass none and get torch's."""
    return bool(record.std) and not record.argv[-1].startswith("-std=")

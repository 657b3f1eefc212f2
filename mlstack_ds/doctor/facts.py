"""System facts the doctor needs beyond detect's `Environment`.

Everything machine-wide is read below one `root` directory (default `/`): `dev/kfd`, `dev/shm`,
`proc/cmdline`, `sys/class/iommu`, `sys/class/kfd/...`, `usr/include`. Tests point `root` at a
temporary tree of fake files, so the real reading code runs. Facts about the *target* interpreter
(its headers, its prefix, its pip packages, DeepSpeed's RECORD) come from the target probe's first line
(`detect.target_probe`), which needs no torch import: doctor answers when torch hangs or is broken.
Nothing here raises for what a machine lacks: unknowns are `None` and problems become warnings.
"""

from __future__ import annotations

import grp
import os
import re
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds import gfx
from mlstack_ds.detect.model import Environment
from mlstack_ds.detect.probes import find_rocm_root
from mlstack_ds.detect.target_probe import TargetFacts, probe_target
from mlstack_ds.detect.toolchain import CXX_NAMES, find_cxx, has_libaio_headers
from mlstack_ds.doctor.jitlocks import JitLockScan, scan_jit_locks
from mlstack_ds.doctor.shmsegments import ShmScan, scan_shm_segments
from mlstack_ds.installed.build_record import DeepSpeedBuild, read_deepspeed_build
from mlstack_ds.installed.health import InstalledState, check_health
from mlstack_ds.installed.integrity import check_files
from mlstack_ds.installed.journal import unfinished_change
from mlstack_ds.installed.receipt import ReceiptError, read_receipt, receipt_path
from mlstack_ds.runner import which

COMPILERS = CXX_NAMES


@dataclass(frozen=True)
class SystemFacts:
    root: str = "/"
    kfd_exists: bool = False
    kfd_accessible: bool = False
    kfd_group: str | None = None
    user_groups: tuple[str, ...] = ()
    is_root: bool = False
    shm_bytes: int | None = None
    memlock_soft_bytes: int | None = None  # None: unlimited (or unknown)
    tools: Mapping[str, str | None] = field(default_factory=dict)  # c++/g++/clang++/ninja/numactl/hipcc
    rocm_home: str | None = None
    rocm_info_version_file: bool = False  # <rocm_home>/.info/version, DeepSpeed's first version source
    usr_rocm_version_header: bool = False  # /usr/include/rocm_version.h, DeepSpeed's last one
    python_include: str | None = None
    python_headers: bool = False
    target_prefix: str | None = None
    nvidia_packages: tuple[str, ...] = ()
    clients: tuple[tuple[str, str], ...] = ()  # the target's transformers/accelerate/peft/lightning versions
    receipt_patches: tuple[str, ...] = ()  # the patch files the receipt says DeepSpeed was built with
    libaio_headers: bool = False
    ds_build: DeepSpeedBuild | None = None
    receipt_path: str | None = None
    receipt_exists: bool = False
    install_damage: tuple[str, ...] = ()  # why the install is not what was installed (install.check_health)
    kernel_cmdline: str | None = None
    iommu_enabled: bool | None = None  # None: unknown (no /sys/class/iommu)
    kfd_native_archs: tuple[str, ...] = ()  # GPU nodes' real targets per KFD, overrides ignored
    rocm_env_missing: tuple[str, ...] = ()  # "ROCM_PATH=/x" for ROCM_PATH/ROCM_HOME set to no directory
    jit_locks: JitLockScan | None = None  # torch JIT build locks, with their live owners
    shm_segments: ShmScan | None = None  # DeepSpeed's CPU all-reduce segments in dev/shm, with their users
    warnings: tuple[str, ...] = ()

    cxx: str | None = None  # toolchain.find_cxx: what a build uses ($CXX, else c++/g++/clang++)
    cxx_variable: str | None = None  # $CXX as set

    @property
    def cxx_compiler(self) -> str | None:
        if self.cxx_variable or self.cxx:
            return self.cxx
        return next((self.tools[c] for c in COMPILERS if self.tools.get(c)), None)


def collect_facts(
    env: Environment,
    environ: Mapping[str, str] | None = None,
    root: Path = Path("/"),
    target: TargetFacts | None = None,
) -> SystemFacts:
    """Read the facts for `env` (its target interpreter, its DeepSpeed) below `root`.
    `target`: the probe detect made (`detect_with_target`), whose warnings detect already reported;
    without it the interpreter is asked here (the quick probe: no torch import)."""
    environ = dict(os.environ if environ is None else environ)
    kfd = root / "dev" / "kfd"
    rocm_root = find_rocm_root(environ)
    extra_dirs = [rocm_root / "bin"] if rocm_root else []
    search_path = environ.get("PATH", "")
    tools = {name: _str(which(name, path=search_path)) for name in (*COMPILERS, "ninja", "numactl")}
    tools["hipcc"] = _str(which("hipcc", extra_dirs=extra_dirs, path=search_path))
    warnings: list[str] = []
    if target is None:
        target = probe_target(Path(env.python.executable), environ, torch=False)
        warnings += target.warnings
    include_dir, prefix = target.python.include_dir, target.python.prefix
    headers = bool(include_dir) and Path(include_dir or "", "Python.h").is_file()
    ds_build = None
    if env.deepspeed and env.deepspeed.location:
        ds_build = read_deepspeed_build(Path(env.deepspeed.location) / "deepspeed", warnings)
    rocm_home = _rocm_home(environ, rocm_root, tools["hipcc"])
    receipt = receipt_path(prefix) if prefix else None
    return SystemFacts(
        root=str(root),
        kfd_exists=kfd.exists(),
        kfd_accessible=kfd.exists() and os.access(kfd, os.R_OK | os.W_OK),
        kfd_group=_group_of(kfd),
        user_groups=_user_groups(),
        is_root=os.geteuid() == 0,
        shm_bytes=_filesystem_size(root / "dev" / "shm"),
        memlock_soft_bytes=_memlock_soft_limit(),
        tools=tools,
        rocm_home=rocm_home,
        rocm_info_version_file=bool(rocm_home) and Path(rocm_home or "", ".info", "version").is_file(),
        usr_rocm_version_header=(root / "usr" / "include" / "rocm_version.h").is_file(),
        python_include=include_dir,
        python_headers=headers,
        target_prefix=prefix,
        nvidia_packages=target.nvidia_packages,
        clients=target.clients,
        receipt_patches=receipt_patches(prefix),
        libaio_headers=has_libaio_headers(environ, root),
        cxx=find_cxx(environ),
        cxx_variable=environ.get("CXX") or None,
        ds_build=ds_build,
        receipt_path=str(receipt) if receipt else None,
        receipt_exists=bool(receipt and receipt.is_file()),
        install_damage=install_damage(env, target, ds_build),
        kernel_cmdline=_read_text(root / "proc" / "cmdline"),
        iommu_enabled=_iommu_enabled(root / "sys" / "class" / "iommu"),
        kfd_native_archs=kfd_native_archs(root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"),
        rocm_env_missing=rocm_env_missing(environ),
        jit_locks=scan_jit_locks(environ, proc=root / "proc"),
        shm_segments=scan_shm_segments(root / "dev" / "shm", proc=root / "proc"),
        warnings=tuple(warnings),
    )


def install_damage(env: Environment, target: TargetFacts, ds_build: DeepSpeedBuild | None) -> tuple[str, ...]:
    """`install.check_health` on what detect's target probe saw (the same judgement as `status` and
    `install`); with no receipt, only the installed files against their RECORD; an unusable receipt is
    itself the damage."""
    prefix = target.python.prefix
    if not prefix:
        return ()
    unfinished = unfinished_change(prefix, target.python.executable)
    if unfinished is not None:  # the files are mid-swap: that, not what they look like now, is the finding
        return (unfinished,)
    try:
        receipt = read_receipt(prefix)
    except ReceiptError as exc:
        return (exc.message,)
    if receipt is None:
        files = check_files(target.deepspeed_record) if env.deepspeed and target.deepspeed_record else None
        return (f"installed files changed: {files.summary()}",) if files and not files.ok else ()
    state = InstalledState(
        prefix=prefix,
        deepspeed_version=env.deepspeed.version if env.deepspeed else None,
        deepspeed_location=env.deepspeed.location if env.deepspeed else None,
        prebuilt_ops=tuple(ds_build.prebuilt_ops) if ds_build else (),
        torch_version=env.torch.version if env.torch else None,
        record=target.deepspeed_record,
    )
    return check_health(receipt, state).problems


def receipt_patches(prefix: str | None) -> tuple[str, ...]:
    """The patches the receipt lists; none without a readable receipt (its damage is `install_damage`'s)."""
    if not prefix:
        return ()
    try:
        receipt = read_receipt(prefix)
    except ReceiptError:
        return ()
    return tuple(p["name"] for p in receipt.patches) if receipt else ()


_TARGET_VERSION_RE = re.compile(r"^gfx_target_version\s+(\d+)\s*$", re.MULTILINE)


def parse_gfx_target_version(properties: str) -> str | None:
    """KFD's `gfx_target_version 90010` -> `gfx90a` (major*10000 + minor*100 + stepping); 0 is a CPU."""
    match = _TARGET_VERSION_RE.search(properties)
    if not match or int(match.group(1)) == 0:
        return None
    value = int(match.group(1))
    return gfx.arch_from_override(f"{value // 10000}.{value // 100 % 100}.{value % 100}")


def kfd_native_archs(nodes_dir: Path) -> tuple[str, ...]:
    """The real target of every GPU node in KFD's topology (HSA_OVERRIDE_GFX_VERSION does not reach
    the kernel driver), in node order."""
    try:
        nodes = sorted((p for p in nodes_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return ()
    archs = [parse_gfx_target_version(_read_text(node / "properties") or "") for node in nodes]
    return tuple(a for a in archs if a)


def rocm_env_missing(environ: Mapping[str, str]) -> tuple[str, ...]:
    """ROCM_PATH / ROCM_HOME values that are set but name no directory (torch and DeepSpeed take them
    as given; detect silently falls back to /opt/rocm, which hides the mistake)."""
    return tuple(f"{name}={environ[name]}" for name in ("ROCM_PATH", "ROCM_HOME")
                 if environ.get(name) and not Path(environ[name]).is_dir())


def _rocm_home(environ: Mapping[str, str], rocm_root: Path | None, hipcc: str | None) -> str | None:
    """Where torch's cpp_extension will look for ROCm: ROCM_HOME/ROCM_PATH, else hipcc's prefix."""
    if rocm_root:
        return str(rocm_root)
    if hipcc:
        return str(Path(hipcc).resolve().parent.parent)
    return None


def _iommu_enabled(path: Path) -> bool | None:
    try:
        return any(path.iterdir())
    except OSError:
        return None


def _filesystem_size(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def _memlock_soft_limit() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def _user_groups() -> tuple[str, ...]:
    return tuple(sorted({_group_name(gid) for gid in {*os.getgroups(), os.getegid()}}))


def _group_of(path: Path) -> str | None:
    try:
        return _group_name(path.stat().st_gid)
    except OSError:
        return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _str(path: Path | None) -> str | None:
    return str(path) if path else None

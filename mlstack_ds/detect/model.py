"""The frozen facts `detect` hands to every later stage (plan, doctor, verify).

Field names are part of the `detect --json` contract; add fields, never rename them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mlstack_ds.detect.wheel_builder import wheel_build_problem

Platform = Literal["rocm", "cuda", "cpu"]

# Environment variables that change what DeepSpeed builds or which devices it sees.
TRACKED_ENV_VARS: tuple[str, ...] = (
    "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_ROCM_ARCH",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "DS_ACCELERATOR",
    "ROCM_PATH",
    "ROCM_HOME",
    "HIP_PLATFORM",
    "TORCH_CUDA_ARCH_LIST",
    "DS_BUILD_OPS",
    "CXX",
)


@dataclass(frozen=True)
class RocmInstall:
    root: str | None
    version: str | None  # "6.2.4", or "6.1" when only a (legacy, <= 7.2) HIP version string was available
    version_source: str | None  # which source answered, e.g. "<root>/.info/version"
    raw_version: str | None = None  # the string as the source printed it
    kind: Literal["system", "wheels"] = "system"  # a ROCm root on disk, or TheRock's wheels in the target


@dataclass(frozen=True)
class RocmWheels:
    """ROCm installed as Python wheels (TheRock's `rocm`/`rocm-sdk-*`) in the target environment, read by the
    target probe without importing torch. Package directories carry a build nonce in their names
    (`_rocm_sdk_core*`), so they are reported as found, never guessed."""

    version: str | None  # rocm_sdk.__version__ ("7.14.0", "10.1.0a20260811"), else the core's .info/version
    version_source: str | None
    core: str | None  # the runtime package directory (`.info/version`, bin/rocminfo, amd-smi)
    devel_installed: bool  # rocm[devel]: the `rocm_sdk_devel` package is importable
    devel_root: str | None  # the devel tree (headers, hipcc): where ROCM_HOME must point
    devel_expanded: bool  # `rocm-sdk init` (or a first hipcc call) has expanded the devel tarball
    libraries: bool  # rocm[libraries] (hipBLAS, rocRAND, ...)
    device_targets: tuple[str, ...]  # the installed rocm-sdk-device-gfx* distributions' targets
    scripts_dir: str | None  # the environment's bin: the trampolines (rocminfo, hipcc, rocm-sdk)
    problem: str | None = None  # why part of it could not be read


@dataclass(frozen=True)
class GpuAgent:
    index: int
    arch: str  # base target without feature suffixes: "gfx90a"; "" when unknown
    target_id: str  # full target id: "gfx90a:sramecc+:xnack-"
    name: str  # marketing name
    wavefront_size: int | None
    compute_units: int | None
    vram_bytes: int | None
    integrated: bool
    node: int | None
    vendor: str = "amd"
    family: str = "unknown"
    uuid: str | None = None
    source: str = "rocminfo"  # which tool reported it
    spoofed: bool = False  # arch forced by HSA_OVERRIDE_GFX_VERSION


@dataclass(frozen=True)
class TorchDevice:
    name: str
    gcn_arch_name: str | None


@dataclass(frozen=True)
class TorchInfo:
    version: str
    hip: str | None
    cuda: str | None
    arch_list: list[str]
    device_count: int
    devices: list[TorchDevice]
    path: str | None = None

    @property
    def build(self) -> Platform:
        """The kind of torch build: what it was compiled for, not what devices it sees."""
        if self.hip:
            return "rocm"
        if self.cuda:
            return "cuda"
        return "cpu"


@dataclass(frozen=True)
class PythonInfo:
    executable: str
    version: str
    prefix: str | None = None  # sys.prefix: where the receipt of an install into this env lives
    include_dir: str | None = None  # where Python.h must be for ops to compile
    site_packages: tuple[str, ...] = ()  # purelib and platlib: where pip puts DeepSpeed and .pth files are read
    setuptools: str | None = None  # its version: the build runs setuptools' bdist_wheel
    wheel_package: bool | None = None  # `wheel` is there (bdist_wheel before setuptools 70.1); None: not asked

    @property
    def wheel_build_problem(self) -> str | None:
        """Why this interpreter cannot build DeepSpeed's wheel (detect/wheel_builder.py), or None (it can,
        or it was not asked)."""
        if self.wheel_package is None:
            return None
        return wheel_build_problem(self.setuptools, self.wheel_package)


@dataclass(frozen=True)
class DeepSpeedInfo:
    version: str
    location: str | None


@dataclass(frozen=True)
class Environment:
    platform: Platform
    rocm: RocmInstall | None
    gpus: list[GpuAgent]
    torch: TorchInfo | None
    python: PythonInfo
    env: dict[str, str | None]
    warnings: list[str] = field(default_factory=list)
    deepspeed: DeepSpeedInfo | None = None
    rocm_wheels: RocmWheels | None = None  # TheRock's ROCm wheels in the target, whichever ROCm is used
    system_rocm: RocmInstall | None = None  # a system ROCm found as well when `rocm` is the wheels'
    torch_problem: str | None = None  # why `torch` is None though torch is there: its import failed or was stopped

    @property
    def discrete_gpus(self) -> list[GpuAgent]:
        return [g for g in self.gpus if not g.integrated]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["torch"] = None if self.torch is None else {**asdict(self.torch), "build": self.torch.build}
        return data

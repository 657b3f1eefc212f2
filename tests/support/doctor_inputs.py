"""Replayed machines for doctor rule tests: GPUs parsed from real rocminfo captures, a healthy
baseline of system facts, and small edits of it that trigger (or almost trigger) one rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlstack_ds.detect.environment import decide_platform
from mlstack_ds.detect.model import (
    TRACKED_ENV_VARS,
    DeepSpeedInfo,
    Environment,
    GpuAgent,
    PythonInfo,
    RocmInstall,
    RocmWheels,
    TorchInfo,
)
from mlstack_ds.detect.rocminfo import gpu_agents, parse_rocminfo
from mlstack_ds.doctor.facts import SystemFacts
from mlstack_ds.doctor.model import DoctorInput
from mlstack_ds.installed.build_record import DeepSpeedBuild

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REAL = FIXTURES / "real"
RX7900 = "rocminfo_gfx1100_rocm-issue-3949.txt"  # 1x RX 7900 XTX, ROCm 6.2.2
MI210X4 = "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"  # 4x MI210, ROCm 6.2.4
APU780M = "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt"  # Radeon 780M APU only, ROCm 6.1.1
SPOOFED680M = "rocminfo_680M-igpu_HSA_OVERRIDE-10.3.0-reports-gfx1030_rocm-issue-5225.txt"
# The HIP version string of a real torch build (DeepSpeed PR #5249's MI210, ROCm 6.0).
HIP_60 = (REAL / "torch_version_hip_MI210-gfx90a_rocm-6.0_deepspeed-pr-5249.txt").read_text().strip()
HIP_62 = "6.2.41134-65d174c3e"  # seen in the wild (fixtures SOURCES.md, "other torch.version.hip strings")
# torch 2.5's ROCm 6.2 wheel target list.
ARCHS_62 = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030", "gfx1100", "gfx942"]


def gpus_from(capture: str, hsa_override: str | None = None) -> list[GpuAgent]:
    return gpu_agents(parse_rocminfo((REAL / capture).read_text()), hsa_override)


def rocm_torch(
    version: str = "2.5.1+rocm6.2", hip: str = HIP_62, arch_list: list[str] | None = None
) -> TorchInfo:
    archs = ARCHS_62 if arch_list is None else arch_list
    return TorchInfo(version=version, hip=hip, cuda=None, arch_list=archs, device_count=1, devices=[])


def make_env(
    gpus: list[GpuAgent] | None = None,
    torch: TorchInfo | str | None = "rocm",
    rocm: RocmInstall | None = None,
    env_vars: dict[str, str] | None = None,
    deepspeed: DeepSpeedInfo | None = None,
) -> Environment:
    gpus = gpus_from(RX7900) if gpus is None else gpus
    torch_info = rocm_torch() if torch == "rocm" else torch
    assert not isinstance(torch_info, str)
    if rocm is None:
        rocm = RocmInstall("/opt/rocm-6.2.2", "6.2.2", "/opt/rocm-6.2.2/.info/version", "6.2.2-116")
    amd = [g for g in gpus if g.vendor == "amd"]
    return Environment(
        platform=decide_platform(amd, [], torch_info, rocm_found=True),
        rocm=rocm,
        gpus=gpus,
        torch=torch_info,
        python=PythonInfo("/venv/bin/python", "3.11.7"),
        env={name: (env_vars or {}).get(name) for name in TRACKED_ENV_VARS},
        deepspeed=deepspeed,
    )


def healthy_facts(**changes: Any) -> SystemFacts:
    """A well set-up ROCm workstation (every rule silent)."""
    facts = SystemFacts(
        root="/",
        kfd_exists=True,
        kfd_accessible=True,
        kfd_group="render",
        user_groups=("render", "user", "video"),
        shm_bytes=16 * 1024**3,
        memlock_soft_bytes=None,
        tools={"c++": "/usr/bin/c++", "g++": "/usr/bin/g++", "clang++": None, "ninja": "/usr/bin/ninja",
               "hipcc": "/opt/rocm-6.2.2/bin/hipcc"},
        rocm_home="/opt/rocm-6.2.2",
        rocm_info_version_file=True,
        python_include="/usr/include/python3.11",
        python_headers=True,
        target_prefix="/venv",
        libaio_headers=True,
        receipt_path="/venv/share/mlstack-ds/receipt.json",
        receipt_exists=True,
        kernel_cmdline="BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet iommu=pt",
        iommu_enabled=True,
        kfd_native_archs=("gfx1100",),
    )
    return dataclasses.replace(facts, **changes)


def ds_build(
    ops: dict[str, bool] | None = None, torch_version: str = "2.5", hip: str = "6.2"
) -> DeepSpeedBuild:
    return DeepSpeedBuild(
        path="/venv/lib/python3.11/site-packages/deepspeed/git_version_info_installed.py",
        version="0.19.5",
        installed_ops={"cpu_adam": True, "fused_adam": True} if ops is None else ops,
        torch_version=torch_version, hip_version=hip, cuda_version="0.0", accelerator="cuda",
    )


def make_input(env: Environment | None = None, facts: SystemFacts | None = None, **kw: Any) -> DoctorInput:
    return DoctorInput(env=env or make_env(), facts=facts or healthy_facts(), **kw)


# ROCm as TheRock's wheels in a venv (mlstack_ds.rehearsal.therock lays out the same on disk).
VENV = "/home/u/venv"
VENV_SITE = f"{VENV}/lib/python3.12/site-packages"
# No real TheRock torch's HIP string was captured (the wheels are out of reach here): a stand-in.
HIP_714 = "7.14.0-stand-in"


def rocm_wheels(version: str = "7.14.0", devel: str = "expanded") -> RocmWheels:
    """What detect reads of the wheels: devel "expanded", "tarball" (installed, `rocm-sdk init` not run) or
    "absent" (no rocm[devel])."""
    return RocmWheels(
        version=version, version_source="rocm_sdk.__version__", core=f"{VENV_SITE}/_rocm_sdk_core",
        devel_installed=devel != "absent",
        devel_root=f"{VENV_SITE}/_rocm_sdk_devel" if devel == "expanded" else None,
        devel_expanded=devel == "expanded", libraries=True, device_targets=("gfx1100",),
        scripts_dir=f"{VENV}/bin",
    )


def therock_env(
    wheels: RocmWheels | None = None,
    torch: TorchInfo | str | None = "rocm",
    system_rocm: RocmInstall | None = None,
    env_vars: dict[str, str] | None = None,
) -> Environment:
    """An RX 7900 XTX whose target venv has ROCm as wheels and (by default) a torch built for them; the ROCm
    detect reports is the wheels' (rooted where a build must look), as detect_with_target makes it."""
    wheels = rocm_wheels() if wheels is None else wheels
    torch_info = rocm_torch(f"2.14.1+rocm{wheels.version}", HIP_714, ["gfx1100"]) if torch == "rocm" else torch
    assert not isinstance(torch_info, str)
    rocm = None
    if torch_info is not None and torch_info.hip:
        root = wheels.devel_root if wheels.devel_expanded else wheels.core
        rocm = RocmInstall(root, wheels.version, "rocm_sdk.__version__ (ROCm wheels in the target)", wheels.version,
                           kind="wheels")
    env = make_env(torch=torch_info, rocm=rocm, env_vars=env_vars)
    return dataclasses.replace(env, rocm=rocm, rocm_wheels=wheels, system_rocm=system_rocm,
                               python=PythonInfo(f"{VENV}/bin/python", "3.12.3", prefix=VENV))

"""Predicates several rules share: is this an AMD machine, is the target a ROCm build, and so on."""

from __future__ import annotations

import re

from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.detect.versions import major_minor
from mlstack_ds.doctor.model import DoctorInput

VISIBILITY_VARS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
TORCH_ROCM_INDEX = "https://download.pytorch.org/whl/rocm{rocm}"


def amd_gpus(inp: DoctorInput) -> list[GpuAgent]:
    return [g for g in inp.env.gpus if g.vendor == "amd"]


def amd_hardware(inp: DoctorInput) -> bool:
    """AMD GPUs are visible, or the amdgpu driver's /dev/kfd exists (GPUs hidden from this user)."""
    return bool(amd_gpus(inp)) or inp.facts.kfd_exists


def rocm_torch(inp: DoctorInput) -> bool:
    return inp.env.torch is not None and inp.env.torch.hip is not None


def rocm_target(inp: DoctorInput) -> bool:
    """The target is meant to run DeepSpeed on ROCm: ROCm torch, AMD GPUs, or detect said so."""
    return rocm_torch(inp) or bool(amd_gpus(inp)) or inp.env.platform == "rocm"


def env_value(inp: DoctorInput, name: str) -> str | None:
    value = inp.env.env.get(name)
    return value if value else None


def build_host_configured(inp: DoctorInput) -> bool:
    """A GPU-less ROCm build host set up on purpose: explicit arch list and accelerator."""
    return env_value(inp, "PYTORCH_ROCM_ARCH") is not None and env_value(inp, "DS_ACCELERATOR") == "cuda"


def arch_list(value: str) -> list[str]:
    """`PYTORCH_ROCM_ARCH` / torch's arch list items as base targets: `gfx90a;gfx942` -> both."""
    return [item.split(":", 1)[0] for item in re.split(r"[;,\s]+", value.strip()) if item]


def suggested_rocm_index(inp: DoctorInput) -> str:
    rocm = inp.env.rocm
    return TORCH_ROCM_INDEX.format(rocm=major_minor(rocm.version if rocm else None) or "<X.Y>")


def gpu_label(gpu: GpuAgent) -> str:
    return f"GPU {gpu.index} {gpu.arch or '?'}" + (f" ({gpu.name})" if gpu.name else "")

"""Can the target see the GPU, and does torch (and the build) carry code for it?"""

from __future__ import annotations

import re

from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import (
    VISIBILITY_VARS,
    amd_gpus,
    arch_list,
    build_host_configured,
    env_value,
    gpu_label,
    rocm_target,
)

_GROUP_FIX = ("sudo usermod -aG render,video $USER   # then log out and in again",
              "in a container: docker run --device=/dev/kfd --device=/dev/dri "
              "--group-add render --group-add video ...")


def kfd_missing(inp: DoctorInput) -> Hit | None:
    if inp.facts.kfd_exists or not rocm_target(inp) or build_host_configured(inp):
        return None
    return Hit(f"{inp.facts.root.rstrip('/')}/dev/kfd does not exist; the target is a ROCm setup "
               f"(platform {inp.env.platform}, torch HIP {inp.env.torch.hip if inp.env.torch else None})")


def kfd_not_accessible(inp: DoctorInput) -> Hit | None:
    facts = inp.facts
    if not facts.kfd_exists or facts.kfd_accessible:
        return None
    groups = ", ".join(facts.user_groups) or "none"
    return Hit(f"/dev/kfd exists but is not readable and writable by this user "
               f"(device group {facts.kfd_group or '?'}; user groups: {groups})")


def no_gpu_agent(inp: DoctorInput) -> Hit | None:
    facts = inp.facts
    if amd_gpus(inp) or not rocm_target(inp) or build_host_configured(inp):
        return None
    if not facts.kfd_exists or not facts.kfd_accessible:
        return None  # MLS-DEV-001/002 explain why
    tool_notes = [w for w in inp.env.warnings if w.startswith(("rocminfo", "amd-smi", "rocm-smi"))]
    return Hit("rocminfo/amd-smi report no AMD GPU agent although /dev/kfd is accessible"
               + (f"; {tool_notes[0]}" if tool_notes else ""))


def igpu_next_to_dgpu(inp: DoctorInput) -> Hit | None:
    gpus = amd_gpus(inp)
    discrete = [g for g in gpus if not g.integrated]
    integrated = [g for g in gpus if g.integrated]
    if not discrete or not integrated or any(env_value(inp, v) for v in VISIBILITY_VARS):
        return None
    keep = ",".join(str(g.index) for g in discrete)
    archs = ";".join(sorted({g.arch for g in discrete if g.arch}))
    return Hit(
        "integrated " + ", ".join(gpu_label(g) for g in integrated) + " visible next to discrete "
        + ", ".join(gpu_label(g) for g in discrete) + "; no HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES set",
        fix=(f"export HIP_VISIBLE_DEVICES={keep}", f"export PYTORCH_ROCM_ARCH=\"{archs}\"  # for builds",
             "or disable the iGPU in the BIOS"),
    )


def _target_gpus(inp: DoctorInput) -> list[GpuAgent]:
    """The GPUs DeepSpeed is for: the discrete ones, or the iGPU on an APU-only machine."""
    gpus = [g for g in amd_gpus(inp) if g.arch]
    discrete = [g for g in gpus if not g.integrated]
    return discrete or gpus


def arch_missing_from_torch(inp: DoctorInput) -> Hit | None:
    torch = inp.env.torch
    if torch is None or not torch.hip or not torch.arch_list:
        return None
    shipped = set(arch_list(";".join(torch.arch_list)))
    missing = [g for g in _target_gpus(inp) if g.arch not in shipped]
    if not missing:
        return None
    return Hit(
        ", ".join(gpu_label(g) for g in missing) + f" not in torch {torch.version}'s arch list "
        f"({';'.join(torch.arch_list)})",
    )


def rocm_arch_excludes_gpu(inp: DoctorInput) -> Hit | None:
    value = env_value(inp, "PYTORCH_ROCM_ARCH")
    if value is None:
        return None
    listed = set(arch_list(value))
    missing = [g for g in _target_gpus(inp) if g.arch not in listed]
    if not missing:
        return None
    wanted = ";".join(sorted(listed | {g.arch for g in missing}))
    return Hit(
        f"PYTORCH_ROCM_ARCH={value} leaves out " + ", ".join(gpu_label(g) for g in missing),
        fix=(f"export PYTORCH_ROCM_ARCH=\"{wanted}\"",
             "or unset PYTORCH_ROCM_ARCH to build for the detected GPUs"),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-DEV-001", severity="error", title="/dev/kfd is missing: the amdgpu driver is not loaded "
        "or not passed into the container",
        symptom="No GPU is usable; DeepSpeed silently picks its CPU accelerator and builds fail with "
        "`oneapi/ccl.hpp` or kernels get the wrong wavefront size.",
        fix=("sudo modprobe amdgpu   # or install the amdgpu-dkms driver and reboot",
             "in a container: docker run --device=/dev/kfd --device=/dev/dri ...",
             "on a GPU-less build host on purpose: export DS_ACCELERATOR=cuda PYTORCH_ROCM_ARCH=<gfx...>"),
        source="F12 (lamikr/rocm_sdk_builder#8: VM without /dev/kfd), F02",
        check=kfd_missing,
    ),
    Rule(
        id="MLS-DEV-002", severity="error", title="/dev/kfd is not accessible to this user",
        symptom="The user is not in the `render`/`video` groups: torch sees no GPU, DeepSpeed builds "
        "for the CPU accelerator.",
        fix=_GROUP_FIX,
        source="F12 (user missing from render/video), F02",
        check=kfd_not_accessible,
    ),
    Rule(
        id="MLS-GPU-001", severity="error", title="No AMD GPU agent is visible",
        symptom="rocminfo lists no GPU agent; DeepSpeed's op builder then guesses the arch and a "
        "wavefront size of 32 and bakes them into the kernels.",
        fix=("rocminfo   # must list a GPU agent; check HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES",
             "on a GPU-less build host on purpose: export DS_ACCELERATOR=cuda PYTORCH_ROCM_ARCH=<gfx...>"),
        source="F02 (get_rocm_wavefront_size defaults to 32), F12",
        check=no_gpu_agent,
    ),
    Rule(
        id="MLS-GPU-002", severity="warning", title="An integrated GPU is visible next to the discrete GPU",
        symptom="torch counts the iGPU as a device (`cuda:1` may be a 2-CU iGPU), launchers give it a "
        "rank, and DeepSpeed may take its arch for the build.",
        fix=("export HIP_VISIBLE_DEVICES=<discrete GPU indices>", "or disable the iGPU in the BIOS"),
        source="F20 (ROCm/ROCm#2594: `export HIP_VISIBLE_DEVICES=0` with a Ryzen 7000 iGPU)",
        check=igpu_next_to_dgpu,
    ),
    Rule(
        id="MLS-ARCH-001", severity="error", title="torch has no code for this GPU's arch",
        symptom="`hipErrorNoBinaryForGpu: Unable to find code object for all current devices!`, "
        "`HIP error: invalid device function`, or rocBLAS cannot read `TensileLibrary.dat`.",
        fix=("pip install torch --index-url https://download.pytorch.org/whl/rocm<X.Y>  # a release that "
             "lists your gfx in torch.cuda.get_arch_list()",
             "last resort on an unsupported consumer GPU: a same-family HSA_OVERRIDE_GFX_VERSION "
             "(see MLS-ENV-002)"),
        source="F19 (ROCm/legacy-rocm-build#2061, pytorch/pytorch#53738, pytorch/pytorch#96964)",
        check=arch_missing_from_torch,
        log_patterns=(re.compile(r"hipErrorNoBinaryForGpu"), re.compile(r"invalid device function"),
                      re.compile(r"TensileLibrary\.dat: No such file")),
    ),
    Rule(
        id="MLS-ARCH-002", severity="error", title="PYTORCH_ROCM_ARCH leaves out the detected GPU",
        symptom="Ops are compiled only for the listed targets; on this GPU they fail with "
        "`invalid device function`.",
        fix=("export PYTORCH_ROCM_ARCH=\"<every gfx you run on>\"", "or unset it"),
        source="F02 (one arch list for the whole build), F19",
        check=rocm_arch_excludes_gpu,
    ),
)

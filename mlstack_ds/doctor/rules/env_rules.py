"""Environment variables that mislead ROCm or DeepSpeed, and ROCm releases too old for the job."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from mlstack_ds import gfx
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import amd_gpus, env_value, rocm_target, rocm_torch
from mlstack_ds.doctor.rules.variable_rules import SUPPORTED_DS_ACCELERATORS


def _override(inp: DoctorInput) -> tuple[str, str | None] | None:
    value = env_value(inp, "HSA_OVERRIDE_GFX_VERSION")
    return None if value is None else (value, gfx.arch_from_override(value))


def _natively_supported(arch: str, inp: DoctorInput) -> bool:
    rocm = inp.env.rocm
    if not gfx.catalog().get(arch) or not gfx.lookup(arch).first_rocm:
        return False
    return not (rocm and rocm.version and gfx.rocm_supports(arch, rocm.version) is False)


def _incompatible_spoof(native: str, forced: str | None) -> bool:
    if forced is None:
        return True
    a, b = gfx.lookup(native), gfx.lookup(forced)
    return a.wavefront != b.wavefront or (a.known and b.known and a.family != b.family)


def override_on_supported_gpu(inp: DoctorInput) -> Hit | None:
    override = _override(inp)
    if override is None:
        return None
    value, forced = override
    native = [a for a in inp.facts.kfd_native_archs if not _incompatible_spoof(a, forced)]
    supported = [a for a in native if _natively_supported(a, inp)]
    if not supported:
        return None
    return Hit(f"HSA_OVERRIDE_GFX_VERSION={value} (reports {forced}) on {', '.join(supported)}, "
               "which this ROCm supports natively")


def override_spoofs_other_family(inp: DoctorInput) -> Hit | None:
    override = _override(inp)
    if override is None:
        return None
    value, forced = override
    if forced is None:
        return Hit(f"HSA_OVERRIDE_GFX_VERSION={value} is not a <major>.<minor>.<stepping> target version")
    bad = [a for a in inp.facts.kfd_native_archs if _incompatible_spoof(a, forced)]
    if not bad:
        return None
    target = gfx.lookup(forced)
    natives = ", ".join(f"{a} ({gfx.lookup(a).family}, wave{gfx.lookup(a).wavefront})" for a in bad)
    return Hit(f"HSA_OVERRIDE_GFX_VERSION={value} makes ROCm run {forced} ({target.family}, "
               f"wave{target.wavefront}) code on {natives}")


def override_in_effect(inp: DoctorInput) -> Hit | None:
    """Always say the override is set (it changes every arch the tools report), unless a stronger
    override rule already spoke."""
    if _override(inp) is None or override_on_supported_gpu(inp) or override_spoofs_other_family(inp):
        return None
    value, forced = _override(inp) or ("", None)
    reported = ", ".join(sorted({g.arch for g in amd_gpus(inp) if g.arch})) or "none"
    native = ", ".join(inp.facts.kfd_native_archs) or "unknown (no KFD topology)"
    return Hit(f"HSA_OVERRIDE_GFX_VERSION={value}: GPUs report {reported} (forced {forced}); "
               f"native: {native}")


def ds_accelerator_not_cuda(inp: DoctorInput) -> Hit | None:
    """An accepted accelerator other than cuda on ROCm; values DeepSpeed rejects are MLS-ENV-005's."""
    value = env_value(inp, "DS_ACCELERATOR")
    if value is None or value == "cuda" or value not in SUPPORTED_DS_ACCELERATORS or not rocm_target(inp):
        return None
    return Hit(f"DS_ACCELERATOR={value} on ROCm: DeepSpeed will use its {value} accelerator, not the GPU")


def rocm_too_old_for_gpu(inp: DoctorInput) -> Hit | None:
    rocm = inp.env.rocm
    if rocm is None or not rocm.version:
        return None
    old = [g for g in amd_gpus(inp) if g.arch and gfx.rocm_supports(g.arch, rocm.version) is False]
    if not old:
        return None
    needs = ", ".join(f"{g.arch} needs ROCm >= {gfx.lookup(g.arch).first_rocm}" for g in old)
    newest = max((gfx.lookup(g.arch).first_rocm for g in old), key=Version)
    return Hit(f"ROCm {rocm.version} (from {rocm.version_source}); {needs}",
               fix=(f"install ROCm >= {newest} and a torch built for it",))


def rocm_too_old_for_recipe(inp: DoctorInput) -> Hit | None:
    rocm = inp.env.rocm
    if rocm is None or not rocm.version or not rocm_target(inp):
        return None
    try:
        if Version(rocm.version) >= Version(inp.min_rocm):
            return None
    except InvalidVersion:
        return None
    return Hit(f"ROCm {rocm.version} (from {rocm.version_source}); "
               f"the DeepSpeed recipe needs >= {inp.min_rocm}",
               fix=(f"install ROCm >= {inp.min_rocm} and a torch built for it",))


def rocm_version_undetectable(inp: DoctorInput) -> Hit | None:
    torch, facts = inp.env.torch, inp.facts
    if not rocm_torch(inp) or torch is None:
        return None
    if facts.rocm_info_version_file or "rocm" in torch.version or facts.usr_rocm_version_header:
        return None
    return Hit(f"no {facts.rocm_home or '<ROCM_HOME>'}/.info/version, torch {torch.version} has no "
               "+rocmX.Y suffix, no /usr/include/rocm_version.h",
               fix=("export ROCM_HOME=<the ROCm root that has .info/version>",
                    "or create <ROCM_HOME>/.info/version holding the ROCm version, e.g. 6.2.4"))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-ENV-001", severity="warning",
        title="HSA_OVERRIDE_GFX_VERSION is set on a GPU this ROCm supports natively",
        symptom="A stale override makes a supported GPU run another target's code: memory access "
        "faults (`Reason: unknown`) or `invalid device function`.",
        fix=("unset HSA_OVERRIDE_GFX_VERSION   # and remove it from ~/.bashrc, /etc/environment",),
        source="F18 (ROCm/legacy-rocm-build#5238: MI210 with a forgotten gfx1030 override; ROCm/ROCm#3207)",
        check=override_on_supported_gpu,
    ),
    Rule(
        id="MLS-ENV-002", severity="error",
        title="HSA_OVERRIDE_GFX_VERSION spoofs a different GPU family or wavefront size",
        symptom="Kernels compiled for another family run on this GPU: `Memory access fault by GPU ... "
        "Reason: unknown`, wrong results, hangs.",
        fix=("unset HSA_OVERRIDE_GFX_VERSION",
             "if the GPU is unsupported, use the nearest same-family target only "
             "(10.3.0 for gfx1031/1032, 11.0.0 for gfx1101/1102) and build DeepSpeed for that target"),
        source="F18 (ROCm/legacy-rocm-build#5238, ROCm/ROCm#5225), F23",
        check=override_spoofs_other_family,
    ),
    Rule(
        id="MLS-ENV-003", severity="error", title="DS_ACCELERATOR is not `cuda` on ROCm",
        symptom="DeepSpeed's ROCm support lives in its `cuda` accelerator; `cpu` builds CPU ops "
        "(`oneapi/ccl.hpp`) and runs nothing on the GPU (values DeepSpeed rejects: MLS-ENV-005).",
        fix=("export DS_ACCELERATOR=cuda   # or unset it",),
        source="F12 (DS_ACCELERATOR=cuda for ROCm builds; accelerator/real_accelerator.py)",
        check=ds_accelerator_not_cuda,
    ),
    Rule(
        id="MLS-ENV-004", severity="info", title="HSA_OVERRIDE_GFX_VERSION is in effect",
        symptom="Every tool (rocminfo, torch, DeepSpeed's arch detection) reports the forced target, "
        "not the GPU's own.",
        fix=("keep it only for an unsupported consumer GPU, with a same-family target, and build "
             "DeepSpeed for that same target",),
        source="F18 (the variable is set: always report it)",
        check=override_in_effect,
    ),
    Rule(
        id="MLS-ROCM-001", severity="error", title="ROCm is too old for this GPU",
        symptom="The runtime or compiler does not know the GPU's target (e.g. gfx1100 before ROCm 5.5, "
        "gfx1201 before 6.4): no agent, or no code objects for it.",
        fix=("install a ROCm release that supports the GPU, then a torch built for it",),
        source="F19 (7900 XTX with torch 2.0.0 before Navi3x support, pytorch/pytorch#96964)",
        check=rocm_too_old_for_gpu,
    ),
    Rule(
        id="MLS-ROCM-002", severity="error", title="ROCm is older than the DeepSpeed recipe supports",
        symptom="The pinned DeepSpeed and its patch set are built and tested only from the recipe's "
        "minimum ROCm up.",
        fix=("install a newer ROCm (the recipe's `min_rocm` or later) and a torch built for it",),
        source="recipes/deepspeed-0.19.5.toml `min_rocm`; F01/F05 (older ROCm releases break the ops build)",
        check=rocm_too_old_for_recipe,
    ),
    Rule(
        id="MLS-ROCM-003", severity="error", title="DeepSpeed cannot find the ROCm version",
        symptom="`AssertionError: Could not detect ROCm version` (or `No such file or directory: "
        "'/opt/rocm/.info/version-dev'`) while installing or loading ops.",
        fix=("export ROCM_HOME=<ROCm root with .info/version>",
             "or write the version into <ROCM_HOME>/.info/version"),
        source="F05 (deepspeedai/DeepSpeed#2080, #3715; ROCm/legacy-rocm-build#419)",
        check=rocm_version_undetectable,
        log_patterns=(re.compile(r"Could not detect ROCm version"),
                      re.compile(r"No such file or directory: '[^']*\.info/version(-dev)?'")),
    ),
)

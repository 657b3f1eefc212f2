"""The installed DeepSpeed: prebuilt or not, built against this torch or another, installed by us or not."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from mlstack_ds.detect.versions import major_minor
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import amd_gpus, rocm_torch

_REINSTALL = "mlstack-ds install   # rebuilds DeepSpeed's ops for this torch and GPU"


def no_prebuilt_ops(inp: DoctorInput) -> Hit | None:
    ds, build = inp.env.deepspeed, inp.facts.ds_build
    if ds is None or build is None or build.prebuilt_ops:
        return None
    return Hit(f"DeepSpeed {ds.version}: no op is marked installed in {build.path}; "
               f"compiled w. torch {build.torch_version}, hip {build.hip_version}")


def built_for_other_torch(inp: DoctorInput) -> Hit | None:
    torch, build = inp.env.torch, inp.facts.ds_build
    if torch is None or build is None or not build.prebuilt_ops:
        return None
    seen = []
    torch_mm = major_minor(torch.version)
    if build.torch_version != torch_mm:
        seen.append(f"ops built with torch {build.torch_version}, running torch {torch_mm}")
    hip_mm = major_minor(torch.hip)
    if hip_mm and build.hip_version != hip_mm:
        seen.append(f"ops built with HIP {build.hip_version}, torch's HIP is {hip_mm}")
    if not seen:
        return None
    return Hit("; ".join(seen) + f" (prebuilt: {', '.join(build.prebuilt_ops)})")


def not_installed_by_us(inp: DoctorInput) -> Hit | None:
    if inp.env.deepspeed is None or inp.facts.receipt_exists:
        return None
    return Hit(f"DeepSpeed {inp.env.deepspeed.version} at {inp.env.deepspeed.location}; "
               f"no receipt at {inp.facts.receipt_path or '<prefix>/share/mlstack-ds/receipt.json'}")


def _ds_version(inp: DoctorInput) -> Version | None:
    if inp.env.deepspeed is None:
        return None
    try:
        return Version(inp.env.deepspeed.version)
    except InvalidVersion:
        return None


def cpu_op_jit_broken(inp: DoctorInput) -> Hit | None:
    version = _ds_version(inp)
    if version is None or not rocm_torch(inp) or version.release[:3] != (0, 17, 5):
        return None
    return Hit(f"DeepSpeed {version} with ROCm torch: get_cuda_compile_flag() returns None")


def wave64_hardcoded(inp: DoctorInput) -> Hit | None:
    version = _ds_version(inp)
    wave32 = [g for g in amd_gpus(inp) if g.wavefront_size == 32]
    if version is None or version >= Version("0.14.3") or not wave32:
        return None
    return Hit(f"DeepSpeed {version} assumes a 64-wide warp on HIP; "
               + ", ".join(f"{g.arch} is wave32" for g in wave32))


def install_damaged(inp: DoctorInput) -> Hit | None:
    damage = inp.facts.install_damage
    return Hit("; ".join(damage)) if damage else None


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-DS-001", severity="warning", title="DeepSpeed has no prebuilt ops",
        symptom="`ds_report` shows every op `[NO]` installed and `deepspeed wheel compiled w. ...... "
        "torch 0.0, hip 0.0`: each op is JIT-compiled at first use (slow, and needs the whole toolchain).",
        fix=(_REINSTALL,),
        source="F16 (LUMI ds_report: `compiled w. torch 0.0, hip 0.0`)",
        check=no_prebuilt_ops,
        log_patterns=(re.compile(r"deepspeed wheel compiled w\. \.+ torch 0\.0"),),
    ),
    Rule(
        id="MLS-DS-002", severity="error", title="DeepSpeed's ops were built against another torch/HIP",
        symptom="`RuntimeError: HIP version mismatch! DeepSpeed ops were compiled and installed with a "
        "different version than what is being used at runtime.` (or `PyTorch version mismatch!`)",
        fix=(_REINSTALL, "or reinstall the torch DeepSpeed was built with"),
        source="F17 (op_builder/builder.py validate_torch_op_version; S95Sedan/Deepspeed-Windows#4)",
        check=built_for_other_torch,
        log_patterns=(re.compile(r"version mismatch! DeepSpeed ops were compiled"),),
    ),
    Rule(
        id="MLS-DS-003", severity="warning", title="DeepSpeed was not installed by mlstack-ds",
        symptom="No receipt: nothing records which patches, ops and arch list this DeepSpeed was built "
        "with, so none of the ROCm fixes can be assumed.",
        fix=(_REINSTALL,),
        source="F01-F11 (upstream wheels lack the ROCm fixes the patch set carries)",
        check=not_installed_by_us,
    ),
    Rule(
        id="MLS-DS-004", severity="error", title="DeepSpeed 0.17.5 cannot JIT CPU ops on ROCm",
        symptom="`TypeError: object of type 'NoneType' has no len()` from `strip_empty_entries` when "
        "cpu_adam / cpu_adagrad / cpu_lion load.",
        fix=("pip install 'deepspeed>=0.17.6'   # or: mlstack-ds install",),
        source="F04 (deepspeedai/DeepSpeed PR #7521, #7565)",
        check=cpu_op_jit_broken,
    ),
    Rule(
        id="MLS-DS-005", severity="error", title="DeepSpeed older than 0.14.3 on a wave32 (RDNA) GPU",
        symptom="Op builds fail with `thread_block_tile_internal<64U, void>' is not a direct or virtual "
        "base of 'cooperative_groups::thread_block_tile<64>'`.",
        fix=("mlstack-ds install   # DeepSpeed >= 0.14.3 sizes warps per target",),
        source="F01 (deepspeedai/DeepSpeed#4552, fixed by PR #5402 in v0.14.3)",
        check=wave64_hardcoded,
        log_patterns=(re.compile(r"thread_block_tile_internal<64U"),),
    ),
    Rule(
        id="MLS-DS-006", severity="error", title="The installed DeepSpeed is not what was installed",
        symptom="Files pip installed are missing or modified (e.g. a deleted "
        "`deepspeed/ops/adam/cpu_adam_op*.so`: `cpu_adam` is JIT-compiled or fails at first use), DeepSpeed "
        "was removed or replaced under mlstack-ds's receipt, the receipt itself is unusable, or an install "
        "was killed while pip swapped DeepSpeed's files (its change journal is still there, and `import "
        "deepspeed` is refused until it is repaired).",
        fix=("mlstack-ds install --force   # reinstalls from the wheel cache and writes a new receipt; "
             "an interrupted install is repaired first",),
        source="issue 13 (a deleted cpu_adam_op*.so was reported intact by status, install and doctor); "
        "files checked against the wheel's `*.dist-info/RECORD` (PEP 376/627)",
        check=install_damaged,
    ),
)

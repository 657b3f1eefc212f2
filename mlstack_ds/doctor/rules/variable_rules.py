"""Environment variables set to values DeepSpeed, torch or HIP cannot use.

Why a rule per variable: each of these fails far from where it was set (a `ValueError` deep in
`import deepspeed`, a build that stops at its first CUDA-only op, a torch that sees no GPU), and the
message rarely names the variable. Each check re-derives what the consumer does with the value
(DeepSpeed 0.19.5's `real_accelerator.py` and `setup.py`, torch's `_parse_visible_devices`, our plan's
own `PYTORCH_ROCM_ARCH` parser) so the finding says exactly what will happen.
"""

from __future__ import annotations

import dataclasses
import re

from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import amd_gpus, env_value, rocm_target
from mlstack_ds.errors import UsageError
from mlstack_ds.plan.targets import select_rocm_targets

# DeepSpeed 0.19.5 accelerator/real_accelerator.py SUPPORTED_ACCELERATOR_LIST.
SUPPORTED_DS_ACCELERATORS = ("cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa")


def ds_accelerator_rejected(inp: DoctorInput) -> Hit | None:
    """`get_accelerator()` compares the raw value (no strip, no lower-casing) with its list."""
    if "DS_ACCELERATOR" not in inp.env.env or inp.env.env["DS_ACCELERATOR"] is None:
        return None
    value = inp.env.env["DS_ACCELERATOR"] or ""
    if value in SUPPORTED_DS_ACCELERATORS:
        return None
    listed = "[" + ", ".join(f"'{name}'" for name in SUPPORTED_DS_ACCELERATORS) + "]"
    return Hit(f"DS_ACCELERATOR={value!r}: `import deepspeed` raises `ValueError: DS_ACCELERATOR must be "
               f"one of {listed}. Value \"{value}\" is not supported`")


def _build_ops_value(inp: DoctorInput) -> int | None:
    """DeepSpeed's setup.py: `int(os.environ.get('DS_BUILD_OPS') or default)`; a non-integer crashes it."""
    raw = env_value(inp, "DS_BUILD_OPS")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return 1  # not an int: setup.py stops with a ValueError; the fix is the same


def build_all_ops_on_rocm(inp: DoctorInput) -> Hit | None:
    value = _build_ops_value(inp)
    if not value or not rocm_target(inp):
        return None
    return Hit(f"DS_BUILD_OPS={env_value(inp, 'DS_BUILD_OPS')} on ROCm: building DeepSpeed from source tries "
               "the CUDA-only ops (inference_core_ops, cutlass_ops, ragged_device_ops, evoformer_attn)",
               severity="warning")


def rocm_arch_unusable(inp: DoctorInput) -> Hit | None:
    """The plan's own reading of `PYTORCH_ROCM_ARCH` (`targets.select_rocm_targets`), so doctor and
    `mlstack-ds install` refuse the same values with the same words."""
    value = env_value(inp, "PYTORCH_ROCM_ARCH")
    if value is None:
        return None
    try:
        select_rocm_targets(dataclasses.replace(inp.env, env={"PYTORCH_ROCM_ARCH": value}), None)
    except UsageError as exc:
        return Hit(exc.message, fix=(exc.hint, "or unset PYTORCH_ROCM_ARCH to build for the detected GPUs"))
    return None


def rocm_path_missing(inp: DoctorInput) -> Hit | None:
    missing = inp.facts.rocm_env_missing
    if not missing:
        return None
    return Hit(", ".join(f"{item} is not a directory" for item in missing))


_ORDINAL_RE = re.compile(r"^[+-]?\d+")


def visible_hip_devices(value: str, gpus: list[GpuAgent]) -> list[GpuAgent] | None:
    """The GPUs HIP_VISIBLE_DEVICES leaves visible, read the way torch's `_parse_visible_devices`
    reads it (CUDA's rules): items up to the first invalid one (negative, out of range, unknown
    UUID); a repeated item hides everything. None when UUIDs are given but the GPUs' are unknown."""
    visible: list[GpuAgent] = []
    items = value.split(",")
    by_uuid = value.startswith("GPU-")
    if by_uuid and not any(g.uuid for g in gpus):
        return None
    for raw in items:
        item = raw.strip()
        if by_uuid:
            match = next((g for g in gpus if item.startswith("GPU-") and g.uuid and g.uuid.startswith(item)),
                         None)
        else:
            number = _ORDINAL_RE.match(item)
            index = int(number.group(0)) if number else -1
            match = gpus[index] if 0 <= index < len(gpus) else None
        if match is None:
            break
        if match in visible:
            return []
        visible.append(match)
    return visible


def hip_devices_hide_all(inp: DoctorInput) -> Hit | None:
    value = inp.env.env.get("HIP_VISIBLE_DEVICES")
    gpus = amd_gpus(inp)
    if value is None or not gpus:
        return None
    visible = visible_hip_devices(value, gpus)
    if visible is None or visible:
        return None
    listed = ", ".join(f"{g.index} ({g.arch or '?'}" + (f", {g.uuid})" if g.uuid else ")") for g in gpus)
    return Hit(f"HIP_VISIBLE_DEVICES={value!r} selects none of the detected GPUs: {listed}",
               fix=(f"export HIP_VISIBLE_DEVICES={','.join(str(g.index) for g in gpus if not g.integrated) or '0'}",
                    "or unset HIP_VISIBLE_DEVICES"))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-ENV-005", severity="error", title="DS_ACCELERATOR has a value DeepSpeed rejects",
        symptom="`import deepspeed` (and every op build) fails with `ValueError: DS_ACCELERATOR must be one "
        "of ['cuda', 'cpu', ...]. Value \"...\" is not supported`; `rocm`, `hip` and `CUDA` are all refused.",
        fix=("export DS_ACCELERATOR=cuda   # DeepSpeed's ROCm support is its cuda accelerator; or unset it",),
        source="DeepSpeed 0.19.5 accelerator/real_accelerator.py get_accelerator() (SUPPORTED_ACCELERATOR_LIST); F12",
        check=ds_accelerator_rejected,
        log_patterns=(re.compile(r"DS_ACCELERATOR must be one of \["),),
    ),
    Rule(
        id="MLS-ENV-006", severity="error", title="DS_BUILD_OPS=1 on ROCm builds CUDA-only ops",
        symptom="A source build of upstream DeepSpeed stops at the first CUDA-only op: `ModuleNotFoundError: "
        "No module named 'dskernels'` (cutlass_ops/ragged_device_ops), `hipFuncSetAttribute` errors "
        "(inference_core_ops), or `'cuda_runtime_api.h' file not found`.",
        fix=("unset DS_BUILD_OPS   # or DS_BUILD_OPS=0 and DS_BUILD_<OP>=1 for the ops you need",
             "mlstack-ds install   # builds an allow-list of ops that build on ROCm"),
        source="docs/patches.md 0016 (DS_BUILD_OPS=1 reproduced on the 0.19.5 sdist; deepspeedai/DeepSpeed#7565, "
        "DeepSpeed-MII#550); F11 (deepspeedai/DeepSpeed#3304)",
        check=build_all_ops_on_rocm,
        log_patterns=(re.compile(r"No module named 'dskernels'"),),
        severity_note="warning when only the variable is set (the next source build fails); error when a log "
        "shows the failure",
    ),
    Rule(
        id="MLS-ARCH-003", severity="error",
        title="PYTORCH_ROCM_ARCH is not a usable target list",
        symptom="An unknown target (a typo, `gfx90a:xnack` junk, a marketing name) or wave32 and wave64 "
        "targets mixed: hipcc rejects the `--offload-arch`, or DeepSpeed's kernels get one wavefront size "
        "that is wrong for half the targets; `mlstack-ds install` refuses the same values.",
        fix=("export PYTORCH_ROCM_ARCH=\"<gfx targets of one wavefront size>\"", "or unset it"),
        source="F02 (one ROCM_WAVEFRONT_SIZE per build; deepspeedai/DeepSpeed#7565 arch workarounds); "
        "mlstack_ds.plan.targets.parse_arch_option / select_rocm_targets",
        check=rocm_arch_unusable,
    ),
    Rule(
        id="MLS-ROCM-004", severity="error", title="ROCM_PATH or ROCM_HOME points to no directory",
        symptom="torch's cpp_extension takes ROCM_HOME/ROCM_PATH as given (hipcc, headers, libraries below "
        "it), and DeepSpeed reads the ROCm version there: JIT builds fail and `Could not detect ROCm version`.",
        fix=("export ROCM_PATH=/opt/rocm   # the directory that has bin/hipcc and .info/version",
             "or unset ROCM_PATH ROCM_HOME to use /opt/rocm"),
        source="F05 (deepspeedai/DeepSpeed#2080, #3715: DeepSpeed reads <ROCM_HOME>/.info/version); torch "
        "cpp_extension _find_rocm_home",
        check=rocm_path_missing,
    ),
    Rule(
        id="MLS-GPU-003", severity="error", title="HIP_VISIBLE_DEVICES hides every GPU",
        symptom="torch sees no GPU (`torch.cuda.device_count() == 0`) although rocminfo lists them: DeepSpeed "
        "picks its CPU accelerator or its first GPU call fails.",
        fix=("export HIP_VISIBLE_DEVICES=<indices from 0, or GPU-... UUIDs from rocminfo>",
             "or unset HIP_VISIBLE_DEVICES"),
        source="torch/cuda/__init__.py _parse_visible_devices (CUDA rules: the list stops at the first invalid "
        "item, a repeated item hides all); ROCm docs, GPU isolation; F20 (ROCm/ROCm#2594)",
        check=hip_devices_hide_all,
    ),
)

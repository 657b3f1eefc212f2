"""PyTorch in the target interpreter: missing, built for the wrong platform, or for another ROCm."""

from __future__ import annotations

from mlstack_ds.detect.versions import major_minor
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import amd_gpus, amd_hardware, suggested_rocm_index

_INSTALL_ROCM_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/rocm<X.Y>"


def torch_missing(inp: DoctorInput) -> Hit | None:
    if inp.env.torch is not None:
        return None
    why = f": {inp.env.torch_problem}" if inp.env.torch_problem else ""
    return Hit(f"`import torch` fails in {inp.env.python.executable}{why}")


def cuda_torch_on_amd(inp: DoctorInput) -> Hit | None:
    torch = inp.env.torch
    if torch is None or torch.hip or not amd_hardware(inp):
        return None
    if not (torch.cuda or inp.facts.nvidia_packages):
        return None
    seen = [f"torch {torch.version}: torch.version.hip is None, torch.version.cuda={torch.cuda}"]
    if inp.facts.nvidia_packages:
        seen.append("CUDA wheels installed: " + ", ".join(inp.facts.nvidia_packages[:6]))
    fix = _reinstall_rocm_torch(inp, uninstall_nvidia=bool(inp.facts.nvidia_packages))
    return Hit("; ".join(seen), fix=fix)


def cpu_torch_on_gpu_machine(inp: DoctorInput) -> Hit | None:
    torch = inp.env.torch
    if torch is None or torch.build != "cpu" or inp.facts.nvidia_packages or not amd_hardware(inp):
        return None
    gpus = ", ".join(g.arch for g in amd_gpus(inp)) or "/dev/kfd present"
    return Hit(f"torch {torch.version} has neither HIP nor CUDA; AMD GPU(s): {gpus}",
               fix=_reinstall_rocm_torch(inp, uninstall_nvidia=False))


def torch_hip_differs_from_rocm(inp: DoctorInput) -> Hit | None:
    torch, rocm = inp.env.torch, inp.env.rocm
    if torch is None or not torch.hip or rocm is None or not rocm.version:
        return None
    if rocm.version_source == "torch.version.hip":
        return None  # the system ROCm version is unknown; nothing to compare with
    if rocm.kind == "wheels":
        return None  # TheRock's releases number HIP apart (ROCm 10.1 has HIP 7.16): MLS-ROCM-009 compares +rocmX.Y
    torch_mm, rocm_mm = major_minor(torch.hip), major_minor(rocm.version)
    if not torch_mm or not rocm_mm or torch_mm == rocm_mm:
        return None
    return Hit(
        f"torch {torch.version} is built with HIP {torch.hip} ({torch_mm}); "
        f"the system ROCm at {rocm.root or '?'} is {rocm.version} ({rocm_mm}, from {rocm.version_source})",
        fix=(f"pip install torch --index-url {suggested_rocm_index(inp)}  # the torch for ROCm {rocm_mm}",
             "or install the ROCm release torch was built for, and point ROCM_PATH at it"),
    )


def _reinstall_rocm_torch(inp: DoctorInput, uninstall_nvidia: bool) -> tuple[str, ...]:
    steps = ["pip uninstall -y torch torchvision torchaudio"]
    if uninstall_nvidia:
        steps.append("pip uninstall -y " + " ".join(inp.facts.nvidia_packages))
    steps.append(f"pip install torch --index-url {suggested_rocm_index(inp)}")
    steps.append("then install DeepSpeed with --no-build-isolation so its build sees this torch")
    return tuple(steps)


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-TORCH-001", severity="error", title="PyTorch is not installed in the target Python",
        symptom="`import torch` fails; DeepSpeed cannot be built or imported without it.",
        fix=(_INSTALL_ROCM_TORCH + "  # ROCm; use the torch for your platform elsewhere",),
        source="F16 (deepspeedai/DeepSpeed#7570: install ROCm torch first, then DeepSpeed)",
        check=torch_missing,
    ),
    Rule(
        id="MLS-TORCH-002", severity="error", title="PyTorch is a CUDA build on an AMD machine",
        symptom="`torch.version.hip` is None and `torch.version.cuda` is set (or nvidia-* wheels are "
        "installed); `pip install deepspeed` pulled the PyPI (CUDA) torch.",
        fix=("pip uninstall -y torch torchvision torchaudio", _INSTALL_ROCM_TORCH,
             "install DeepSpeed with --no-build-isolation"),
        source="F16 (deepspeedai/DeepSpeed#7570)",
        check=cuda_torch_on_amd,
    ),
    Rule(
        id="MLS-TORCH-003", severity="error", title="CPU-only PyTorch on a machine with an AMD GPU",
        symptom="torch has neither HIP nor CUDA; DeepSpeed falls back to its CPU accelerator.",
        fix=("pip uninstall -y torch", _INSTALL_ROCM_TORCH),
        source="F16 (torch wheel built for no ROCm at all), F12 (CPU accelerator chosen)",
        check=cpu_torch_on_gpu_machine,
    ),
    Rule(
        id="MLS-TORCH-004", severity="warning", title="torch's HIP version differs from the system ROCm",
        symptom="torch.version.hip major.minor is not the system ROCm's; ops compiled with the system "
        "hipcc link against a different HIP runtime than torch's.",
        fix=(_INSTALL_ROCM_TORCH + "  # X.Y = the system ROCm", "or install the matching ROCm"),
        source="F17 (the HIP major.minor comparison DeepSpeed makes at op load time)",
        check=torch_hip_differs_from_rocm,
    ),
)

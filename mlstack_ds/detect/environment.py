"""Assemble the `Environment`: run the probes, decide the platform, explain what looks wrong."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import gfx
from mlstack_ds.detect import probes
from mlstack_ds.detect.model import (
    TRACKED_ENV_VARS,
    Environment,
    GpuAgent,
    Platform,
    RocmInstall,
    RocmWheels,
    TorchInfo,
)
from mlstack_ds.detect.target_probe import TargetFacts, finish_target_probe, start_target_probe
from mlstack_ds.errors import UsageError
from mlstack_ds.patience import WAITS, Patience


def resolve_python(python: str | Path | None) -> Path:
    """The target interpreter: `--python` (an interpreter or a venv directory), default this one."""
    if python is None:
        return Path(sys.executable)
    # Absolute, not resolved: `./python3` must not become a bare name looked up on PATH, and a venv's
    # bin/python symlink must stay the venv's (resolving it would land in the base interpreter).
    path = Path(os.path.abspath(Path(python).expanduser()))
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "bin" / "python3", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return candidate
        raise UsageError(f"--python {python}: a directory without bin/python", hint="pass the venv's python")
    if not path.exists():
        raise UsageError(f"--python {python}: no such file", hint="pass the path of a Python interpreter")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--python {python}: not executable", hint="pass the path of a Python interpreter")
    return path


@dataclass(frozen=True)
class Detection:
    """detect's `Environment` and the target interpreter's full answer it was made from (the RECORD, the
    package directory, torch's distribution version...), for commands that would otherwise ask again."""

    environment: Environment
    target: TargetFacts


def detect(
    environ: Mapping[str, str] | None = None,
    python: str | Path | None = None,
    tool_patience: Patience = WAITS["rocm tool"],
    rocm_default: Path = probes.DEFAULT_ROCM_ROOT,
) -> Environment:
    """Read the machine and the target interpreter. Never raises for what a machine may lack.
    `rocm_default`: where ROCm is when no variable names it (`/opt/rocm`; a rehearsal's fake host's own)."""
    return detect_with_target(environ, python, tool_patience, rocm_default).environment


def detect_with_target(
    environ: Mapping[str, str] | None = None,
    python: str | Path | None = None,
    tool_patience: Patience = WAITS["rocm tool"],
    rocm_default: Path = probes.DEFAULT_ROCM_ROOT,
) -> Detection:
    """`detect`, keeping the target probe's whole answer (install and doctor reuse it instead of
    starting the interpreter again)."""
    environ = dict(os.environ if environ is None else environ)
    target_python = resolve_python(python)
    hsa_override = environ.get("HSA_OVERRIDE_GFX_VERSION") or None
    wheels_bin = wheels_scripts_dir(target_python)
    ctx = probes.ToolContext(environ=environ, rocm_root=probes.find_rocm_root(environ, rocm_default),
                             patience=tool_patience,
                             first_dirs=(wheels_bin,) if wheels_bin else ())

    # The target probe (seconds: it imports torch) runs while the ROCm tools are asked, not after them.
    with start_target_probe(target_python, environ) as pending_probe:
        amd = probes.amd_gpus(ctx, hsa_override)
        nvidia = probes.nvidia_gpus(ctx)
        target = finish_target_probe(target_python, pending_probe)
    wheels = target.rocm_wheels
    system_rocm = None
    if wheels is not None and target.torch is not None and target.torch.hip:
        # The ROCm the target's torch loads; a system ROCm is only reported beside it, never preferred.
        rocm = wheels_install(wheels)
        system_ctx = probes.ToolContext(environ=environ, rocm_root=ctx.rocm_root, patience=tool_patience)
        system_rocm = probes.rocm_version(system_ctx, None)
        ctx.warnings.extend(system_ctx.warnings)
        if system_rocm is not None and system_rocm.version != rocm.version:
            ctx.warnings.append(
                f"a system ROCm {system_rocm.version or '(unknown version)'} is installed too "
                f"({system_rocm.root or system_rocm.version_source}); the target's torch loads ROCm "
                f"{rocm.version} from its wheels, which builds use")
    else:
        rocm = probes.rocm_version(ctx, target.torch.hip if target.torch else None)

    gpus = amd + [GpuAgent(**{**g.__dict__, "index": len(amd) + g.index}) for g in nvidia] if nvidia else amd
    platform = decide_platform(amd, nvidia, target.torch, rocm_found=rocm is not None)
    warnings = [*ctx.warnings, *target.warnings,
                *explain(amd, platform, target.torch, hsa_override, torch_failed=bool(target.torch_error))]
    environment = Environment(
        platform=platform,
        rocm=rocm,
        gpus=gpus,
        torch=target.torch,
        python=target.python,
        env={name: environ.get(name) for name in TRACKED_ENV_VARS},
        warnings=warnings,
        deepspeed=target.deepspeed,
        rocm_wheels=wheels,
        system_rocm=system_rocm,
        torch_problem=target.torch_error if target.torch is None else None,
    )
    return Detection(environment, target)


def wheels_scripts_dir(python: Path) -> Path | None:
    """The target's bin directory when it holds TheRock's `rocm-sdk` command (the `rocm` wheel's), whose
    trampolines (rocminfo, amd-smi, offload-arch, hipcc) answer for the venv's own ROCm: looked at before
    the target probe answers, so the GPUs are asked in parallel with it."""
    scripts = python.parent
    return scripts if (scripts / "rocm-sdk").is_file() else None


def wheels_install(wheels: RocmWheels) -> RocmInstall:
    """The ROCm of TheRock's wheels as the build sees it: rooted at the devel tree once it is expanded (where
    ROCM_HOME must point), else at the runtime package."""
    root = wheels.devel_root if wheels.devel_expanded else wheels.core
    source = f"{wheels.version_source or 'rocm_sdk'} (ROCm wheels in the target)"
    return RocmInstall(root, wheels.version, source, wheels.version, kind="wheels")


def decide_platform(
    amd: list[GpuAgent], nvidia: list[GpuAgent], torch: TorchInfo | None, rocm_found: bool
) -> Platform:
    """rocm: AMD GPUs visible, or a ROCm build host (ROCm + ROCm torch) without one;
    cuda: NVIDIA GPUs visible (nvidia-smi or a CUDA torch that sees devices); else cpu."""
    if amd:
        return "rocm"
    if nvidia or (torch is not None and torch.cuda and torch.device_count > 0):
        return "cuda"
    if torch is not None and torch.hip and (rocm_found or torch.device_count > 0):
        return "rocm"
    return "cpu"


def explain(
    amd: list[GpuAgent], platform: Platform, torch: TorchInfo | None, hsa_override: str | None,
    torch_failed: bool = False,
) -> list[str]:
    """Warnings a user should read before building: spoofed archs, stray iGPUs, unknown targets.
    `torch_failed`: torch's import failed or was stopped (the probe's own warning says how), so a missing
    `torch` does not mean it is not installed."""
    notes = []
    if hsa_override:
        forced = gfx.arch_from_override(hsa_override)
        archs = ", ".join(sorted({g.arch for g in amd if g.arch})) or "none"
        notes.append(
            f"HSA_OVERRIDE_GFX_VERSION={hsa_override} is set: the reported arch ({archs}) is spoofed"
            + (f" as {forced}" if forced else "")
            + ", not the GPU's native target; kernels built for it may not run correctly"
        )
    discrete = [g for g in amd if not g.integrated]
    integrated = [g for g in amd if g.integrated]
    if discrete and integrated:
        keep = ",".join(str(g.index) for g in discrete)
        names = ", ".join(f"{g.index}: {g.name or g.arch} ({g.arch})" for g in integrated)
        notes.append(
            f"integrated GPU visible next to the discrete GPU(s) [{names}]; hide it with "
            f"HIP_VISIBLE_DEVICES={keep} (or ROCR_VISIBLE_DEVICES={keep})"
        )
    for gpu in amd:
        if gpu.arch and not gfx.lookup(gpu.arch).known:
            notes.append(f"GPU {gpu.index}: target {gpu.arch} is not in mlstack-ds's catalog")
        if not gpu.arch:
            notes.append(f"GPU {gpu.index}: its target (gfx arch) could not be determined")
    if platform == "rocm" and not amd:
        notes.append("ROCm PyTorch found but no AMD GPU is visible: builds need an explicit --arch")
    if torch is None and not torch_failed:
        notes.append("PyTorch is not installed in the target Python")
    return notes

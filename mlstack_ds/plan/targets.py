"""Choose the GPU targets to compile for: what the user asked for, else exactly the detected GPUs.

Why here and not in DeepSpeed's builder: upstream takes the first `gfx` line of rocminfo, so a build
host with no GPU, an iGPU next to a dGPU, or several archs silently gets the wrong kernels.
The order is `--arch`, then `PYTORCH_ROCM_ARCH` (what torch's own extension builder honours, and what a
login node or a Docker build sets), then the detected GPUs; the plan says which one answered. On CUDA the same
with its twin `TORCH_CUDA_ARCH_LIST`, kept as the user spelled it (`9.0a`, `8.0+PTX`): the receipt records it
and verify compares it with each GPU's capability (worker/gpu_targets.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlstack_ds import gfx
from mlstack_ds.detect.model import Environment, TorchInfo
from mlstack_ds.errors import EnvironmentProblem, UsageError
from mlstack_ds.worker.gpu_targets import coverage, parse_cuda_target

TargetSource = Literal["flag", "environment", "detected"]
TARGET_SOURCE_TEXT = {"flag": "--arch", "environment": "PYTORCH_ROCM_ARCH / TORCH_CUDA_ARCH_LIST",
                      "detected": "the detected GPUs", "index": "the index wheel's plan (covering this machine's)"}
CUDA_ARCH_VARIABLE = "TORCH_CUDA_ARCH_LIST"
CUDA_ARCH_EXAMPLE = "e.g. 9.0, or 8.0;9.0a;10.0+PTX"


@dataclass(frozen=True)
class RocmTargets:
    archs: tuple[str, ...]
    wavefront: int
    notes: tuple[str, ...]
    source: TargetSource = "detected"


def parse_arch_option(value: str, origin: str = "--arch") -> tuple[str, ...]:
    """`gfx1100,gfx1101` (commas, semicolons or spaces; feature suffixes dropped) -> validated,
    de-duplicated archs. `origin` names where the value came from in errors (`--arch`, `PYTORCH_ROCM_ARCH`)."""
    archs = []
    shown = f"{origin}={value!r}" if origin.isupper() else origin
    for token in value.replace(";", ",").replace(" ", ",").split(","):
        arch = gfx.base_arch(token.strip()) if token.strip() else ""
        if not arch:
            continue
        if not gfx.is_valid_arch(arch) or arch not in gfx.catalog():
            raise UsageError(f"{shown}: {token.strip()!r} is not a known GPU target",
                             hint=f"known targets: {', '.join(gfx.sorted_archs(gfx.catalog()))}")
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise UsageError(f"{shown}: no GPU target given", hint="e.g. gfx1100, or gfx90a,gfx942")
    return tuple(archs)


def select_rocm_targets(environment: Environment, requested: tuple[str, ...] | None) -> RocmTargets:
    notes: list[str] = []
    from_env = environment.env.get("PYTORCH_ROCM_ARCH") or None
    source: TargetSource
    if requested:
        archs, source = requested, "flag"
        if from_env and set(parse_arch_option(from_env, "PYTORCH_ROCM_ARCH")) != set(requested):
            notes.append(f"PYTORCH_ROCM_ARCH={from_env} ignored: --arch {','.join(requested)} was given")
    elif from_env:
        archs, source = parse_arch_option(from_env, "PYTORCH_ROCM_ARCH"), "environment"
        detected = sorted({g.arch for g in environment.gpus if g.vendor == "amd" and g.arch and not g.integrated})
        if detected and set(detected) != set(archs):
            notes.append(f"building for PYTORCH_ROCM_ARCH={from_env}, not the detected {', '.join(detected)}")
    else:
        source = "detected"
        amd = [g for g in environment.gpus if g.vendor == "amd" and g.arch]
        chosen = gfx.discrete_else_all(amd, lambda g: g.integrated)
        if len(chosen) < len(amd):
            skipped = sorted({g.arch for g in amd if g.integrated})
            notes.append(f"integrated GPU target(s) {', '.join(skipped)} left out: building for the discrete GPUs")
        if not chosen:
            raise EnvironmentProblem(
                "no AMD GPU visible to build for",
                hint="on a build host without a GPU, name the targets: --arch gfx90a (or export "
                "PYTORCH_ROCM_ARCH=gfx90a)",
            )
        if any(g.spoofed for g in chosen):
            notes.append("building for the arch forced by HSA_OVERRIDE_GFX_VERSION, which the runtime will report")
        archs = tuple(dict.fromkeys(g.arch for g in chosen))
        unknown = [a for a in archs if a not in gfx.catalog()]
        if unknown:
            raise EnvironmentProblem(
                f"detected GPU target {unknown[0]} is unknown to mlstack-ds",
                hint="pass --arch with a supported target, or report the GPU",
            )
    by_wave = gfx.wavefront_groups((a, a) for a in archs)
    if len(by_wave) > 1:
        raise UsageError(
            "targets mix wave32 and wave64 GPUs: "
            + "; ".join(f"wave{w}: {','.join(a)}" for w, a in sorted(by_wave.items())),
            hint="DeepSpeed's kernels are compiled for one wavefront size: build one install per family "
            "(e.g. --arch " + ",".join(by_wave[min(by_wave)]) + ")",
        )
    return RocmTargets(archs=archs, wavefront=gfx.lookup(archs[0]).wavefront, notes=tuple(notes), source=source)


def refuse_targets_torch_lacks(archs: tuple[str, ...], torch: TorchInfo) -> str | None:
    """Refuse targets the ROCm torch has no code for (an op built for them could never run beside it);
    the note to show when torch's list is unknown, else None."""
    shipped = [gfx.base_arch(a) for a in torch.arch_list]
    if not shipped:
        return (f"could not check the targets against the archs torch {torch.version} was built for "
                "(it reported none)")
    missing = [a for a in archs if a not in shipped]
    if missing:
        raise EnvironmentProblem(
            f"target {', '.join(missing)} is not in torch {torch.version}'s arch list ({';'.join(torch.arch_list)})",
            hint="ops built for it could not run next to this torch (doctor MLS-ARCH-001): install a ROCm torch "
            "built for it, or choose targets from torch's list",
        )
    return None


def target_source_text(source: str, platform: str) -> str:
    """Where a plan's targets came from, in words: the environment variable of its own platform."""
    if source == "environment":
        return CUDA_ARCH_VARIABLE if platform == "cuda" else "PYTORCH_ROCM_ARCH"
    return TARGET_SOURCE_TEXT.get(source, source)


@dataclass(frozen=True)
class CudaTargets:
    archs: tuple[str, ...]  # as the user spelled them (`9.0a`, `8.0+PTX`); empty: DeepSpeed's own defaults
    notes: tuple[str, ...]
    source: str = "detected"  # "environment", "detected", or "" when no target is named (DeepSpeed's defaults)


def cuda_arch_list(environment: Environment) -> str | None:
    """TORCH_CUDA_ARCH_LIST from the detected NVIDIA GPUs (`8.0;9.0`), None when none is visible."""
    caps = sorted({g.target_id for g in environment.gpus if g.vendor == "nvidia" and g.target_id})
    return ";".join(caps) or None


def parse_cuda_arch_list(value: str) -> tuple[str, ...]:
    """`8.0;9.0a 10.0+PTX` (';' or spaces, as torch and DeepSpeed split it) -> validated, de-duplicated targets.
    Refused: torch's names (`Hopper`, `native`), which DeepSpeed's op builder cannot read, and suffixes no GPU has."""
    shown = f"{CUDA_ARCH_VARIABLE}={value!r}"
    archs: list[str] = []
    for token in value.replace(";", " ").split():
        problem = _cuda_token_problem(token)
        if problem:
            fixed = value.replace(",", ";") if "," in token else None
            raise UsageError(f"{shown}: {token!r} {problem}",
                             hint=f"export {CUDA_ARCH_VARIABLE}=\"{fixed}\"" if fixed else
                             f"name compute capabilities, {CUDA_ARCH_EXAMPLE}; or unset {CUDA_ARCH_VARIABLE} to "
                             "build for the detected GPUs")
        if token not in archs:
            archs.append(token)
    if not archs:
        raise UsageError(f"{shown}: no GPU target given",
                         hint=f"{CUDA_ARCH_EXAMPLE}; or unset {CUDA_ARCH_VARIABLE} to build for the detected GPUs")
    return tuple(archs)


def _cuda_token_problem(token: str) -> str | None:
    """Why one TORCH_CUDA_ARCH_LIST entry cannot be built, or None."""
    target = parse_cuda_target(token)
    if target is None:
        if "," in token:
            return "holds a comma: torch and DeepSpeed split the list at ';' or spaces only"
        if token[:1].isalpha():
            return "is a name: DeepSpeed's op builder reads compute capabilities (X.Y) only"
        return "is not a compute capability (X.Y, X.Ya or X.Yf, optionally with +PTX)"
    if target.kind == "a" and target.major < 9:
        return "asks for arch-specific code, which GPUs have from compute capability 9.0 (Hopper) on"
    if target.kind == "f" and target.major < 10:
        return "asks for family-specific code, which GPUs have from compute capability 10.0 (Blackwell) on"
    return None


def select_cuda_targets(environment: Environment) -> CudaTargets:
    """`TORCH_CUDA_ARCH_LIST` from the user's environment, else the detected GPUs' capabilities, else none
    (DeepSpeed's defaults); a note for each detected GPU the user's list leaves out or reaches only by PTX."""
    value = (environment.env.get(CUDA_ARCH_VARIABLE) or "").strip()
    detected = cuda_arch_list(environment)
    if not value:
        return CudaTargets(tuple(detected.split(";")), (), "detected") if detected else CudaTargets((), (), "")
    archs = parse_cuda_arch_list(value)
    notes = []
    for cap, how in coverage(archs, detected.split(";") if detected else ()).items():
        names = ", ".join(sorted({g.name for g in environment.gpus if g.vendor == "nvidia" and g.target_id == cap}))
        if how is None:
            notes.append(f"{CUDA_ARCH_VARIABLE}={value} leaves out the detected {cap} ({names}): DeepSpeed's "
                         "ops built now would not load on it")
        elif "PTX" in how:
            notes.append(f"{CUDA_ARCH_VARIABLE}={value} reaches the detected {cap} ({names}) only through {how}")
    return CudaTargets(archs, tuple(notes), "environment")


def refuse_cuda_suffixes(archs: tuple[str, ...], version: str, *, patched: bool) -> None:
    """Refuse `9.0a`/`10.0f` targets DeepSpeed's own builder cannot read unless the patch series teaches it:
    `compute_capability_args` takes the minor version with int(), so '0a' raises and every CUDA op fails to
    build (deepspeedai/DeepSpeed#8619). The plain capability builds code that runs on the same GPUs."""
    suffixed = [a for a in archs if (t := parse_cuda_target(a)) is not None and t.kind]
    if not suffixed or patched:
        return
    plain = [f"{t.major}.{t.minor}{'+PTX' if t.ptx else ''}" for t in map(parse_cuda_target, archs) if t]
    raise UsageError(
        f"{CUDA_ARCH_VARIABLE} names {', '.join(suffixed)}: DeepSpeed {version}'s op builder cannot build arch- "
        "or family-specific CUDA targets (it reads the minor version as a number)",
        hint=f'export {CUDA_ARCH_VARIABLE}="{";".join(dict.fromkeys(plain))}" for this install: code for the '
        "plain capability runs on the same GPUs")

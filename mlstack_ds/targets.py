"""Choose the GPU targets to compile for: exactly the detected GPUs, or what the user asked for.

Why here and not in DeepSpeed's builder: upstream takes the first `gfx` line of rocminfo, so a build
host with no GPU, an iGPU next to a dGPU, or several archs silently gets the wrong kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlstack_ds import gfx
from mlstack_ds.detect.model import Environment
from mlstack_ds.errors import EnvironmentProblem, UsageError


@dataclass(frozen=True)
class RocmTargets:
    archs: tuple[str, ...]
    wavefront: int
    notes: tuple[str, ...]


def parse_arch_option(value: str) -> tuple[str, ...]:
    """`--arch gfx1100,gfx1101` (commas, semicolons or spaces) -> validated, de-duplicated archs."""
    archs = []
    for token in value.replace(";", ",").replace(" ", ",").split(","):
        arch = gfx.base_arch(token.strip()) if token.strip() else ""
        if not arch:
            continue
        if not gfx.is_valid_arch(arch) or arch not in gfx.catalog():
            known = ", ".join(sorted(gfx.catalog()))
            raise UsageError(f"--arch {token.strip()}: unknown GPU target", hint=f"known targets: {known}")
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise UsageError("--arch: no GPU target given", hint="e.g. --arch gfx1100 or --arch gfx90a,gfx942")
    return tuple(archs)


def select_rocm_targets(environment: Environment, requested: tuple[str, ...] | None) -> RocmTargets:
    notes: list[str] = []
    if requested:
        archs = requested
    else:
        amd = [g for g in environment.gpus if g.vendor == "amd" and g.arch]
        discrete = [g for g in amd if not g.integrated]
        chosen = discrete or amd
        if discrete and len(discrete) < len(amd):
            skipped = sorted({g.arch for g in amd if g.integrated})
            notes.append(f"integrated GPU target(s) {', '.join(skipped)} left out: building for the discrete GPUs")
        if not chosen:
            raise EnvironmentProblem(
                "no AMD GPU visible to build for",
                hint="pass the targets explicitly, e.g. --arch gfx90a (see `mlstack-ds detect`)",
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
    waves = {gfx.lookup(a).wavefront for a in archs}
    if len(waves) > 1:
        by_wave = {w: [a for a in archs if gfx.lookup(a).wavefront == w] for w in sorted(waves)}
        raise UsageError(
            "targets mix wave32 and wave64 GPUs: "
            + "; ".join(f"wave{w}: {','.join(a)}" for w, a in by_wave.items()),
            hint="DeepSpeed's kernels are compiled for one wavefront size: build one install per family "
            "(e.g. --arch " + ",".join(by_wave[min(waves)]) + ")",
        )
    return RocmTargets(archs=archs, wavefront=waves.pop(), notes=tuple(notes))


def cuda_arch_list(environment: Environment) -> str | None:
    """TORCH_CUDA_ARCH_LIST from the detected NVIDIA GPUs (`8.0;9.0`), None when none is visible."""
    caps = sorted({g.target_id for g in environment.gpus if g.vendor == "nvidia" and g.target_id})
    return ";".join(caps) or None

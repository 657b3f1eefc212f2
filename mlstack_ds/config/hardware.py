"""What the config is planned for: GPUs per node and their VRAM, nodes, host RAM, the GPU target.

Detected by detect's own probes (rocminfo and friends, nvidia-smi) without starting the target
interpreter (the estimates start it once anyway); `--gpus/--vram/--ram/--nodes` override each fact, so
a config can be planned on a machine without the hardware.

Read once per run into one `Hardware`, which everything after takes as given: the GPUs once, host RAM
once, as MemTotal (MemAvailable changes with the load of the moment; a plan must not). The target's
DeepSpeed estimators are pure functions of the numbers sent to them and read nothing of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds import gfx
from mlstack_ds.detect import probes
from mlstack_ds.detect.model import GpuAgent, Platform
from mlstack_ds.errors import UsageError
from mlstack_ds.plan.buildjobs import read_meminfo_bytes

MEASURED = "measured"


@dataclass(frozen=True)
class Hardware:
    platform: Platform
    gpus_per_node: int
    nodes: int
    vram_bytes: int  # per GPU: the smallest of them (ZeRO partitions evenly, the smallest card OOMs first)
    ram_bytes: int | None  # per node
    arch: str | None  # the GPU target (gfx1100), None when unknown (NVIDIA, or planning without a GPU)
    gpu_name: str
    sources: tuple[tuple[str, str], ...]  # fact -> where it came from ("detected", "--gpus", ...)

    def source(self, fact: str) -> str:
        """Where `fact` came from; "given" for a Hardware built without sources (tests, callers)."""
        return dict(self.sources).get(fact, "given")

    @property
    def ram_measured(self) -> bool:
        """Host RAM was read on this machine, not given: the plan then depends on where config runs."""
        return self.source("ram").startswith(MEASURED)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def to_dict(self) -> dict[str, object]:
        return {**{k: v for k, v in self.__dict__.items() if k != "sources"}, "world_size": self.world_size,
                "sources": dict(self.sources)}


def detect_gpus(environ: Mapping[str, str] | None = None) -> list[GpuAgent]:
    """The GPUs detect would report (integrated GPUs dropped next to a discrete one)."""
    env = dict(os.environ if environ is None else environ)
    ctx = probes.ToolContext(environ=env, rocm_root=probes.find_rocm_root(env))
    gpus = probes.amd_gpus(ctx, env.get("HSA_OVERRIDE_GFX_VERSION") or None) + probes.nvidia_gpus(ctx)
    return gfx.discrete_else_all(gpus, lambda g: g.integrated)


def plan_hardware(gpus: list[GpuAgent], *, gpus_per_node: int | None, nodes: int, vram: int | None,
                  ram: int | None, meminfo: Path = Path("/proc/meminfo")) -> Hardware:
    """The facts with the overrides applied; what cannot be known is a UsageError saying which option."""
    for option, value in (("--gpus", gpus_per_node), ("--nodes", nodes)):
        if value is not None and value <= 0:
            raise UsageError(f"{option} {value}: must be greater than zero", hint=f"e.g. {option} 2")
    if not gpus and gpus_per_node is None:
        raise UsageError("no GPU visible (rocminfo, amd-smi, nvidia-smi) and no --gpus",
                         hint="plan for GPUs that are not here with --gpus N --vram SIZE, e.g. --gpus 2 --vram 24GiB")
    sources = [("gpus_per_node", "--gpus" if gpus_per_node else "detected"),
               ("nodes", "--nodes"), ("vram", "--vram" if vram else "detected (the smallest GPU's)")]
    vrams = [g.vram_bytes for g in gpus if g.vram_bytes]
    if vram is None:
        if not vrams:
            raise UsageError("the GPUs' memory is unknown: no GPU reported its VRAM and no --vram",
                             hint="give it with --vram, e.g. --vram 24GiB")
        vram = min(vrams)
    if ram is None:
        ram = read_meminfo_bytes("MemTotal", meminfo)  # the one read of host RAM in a run
        sources.append(("ram", f"{MEASURED}: {meminfo} MemTotal" if ram
                        else f"unknown (no MemTotal in {meminfo})"))
    else:
        sources.append(("ram", "--ram"))
    amd = [g for g in gpus if g.vendor == "amd" and g.arch]
    if gpus:
        platform: Platform = "rocm" if any(g.vendor == "amd" for g in gpus) else "cuda"
        sources.append(("platform", "detected"))
    else:
        platform = "rocm"  # planning without a GPU: this tool's platform
        sources.append(("platform", "assumed (no GPU visible)"))
    sources.append(("arch", "detected" if amd else "unknown"))
    first = gpus[0] if gpus else None
    return Hardware(platform=platform, gpus_per_node=gpus_per_node or len(gpus), nodes=nodes, vram_bytes=vram,
                    ram_bytes=ram, arch=amd[0].arch if amd else None,
                    gpu_name=(first.name or first.arch) if first else "unknown GPU", sources=tuple(sources))

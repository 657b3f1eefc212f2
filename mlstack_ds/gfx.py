"""The GPU target catalog: what the installer must know about each AMD `gfx` target.

The facts live in `gfx_targets.toml` (data, reviewed like data); this module loads them and answers
questions that would otherwise be scattered `if arch.startswith(...)` branches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TypeVar

from packaging.version import InvalidVersion, Version

from mlstack_ds import tomlcompat

T = TypeVar("T")
G = TypeVar("G")
_ARCH_RE = re.compile(r"^gfx([0-9]{1,2})([0-9a-f])([0-9a-f])$")
# LLVM's generic targets (`gfx9-4-generic`, `gfx11-generic`) are code-object targets, not devices.
_GENERIC_RE = re.compile(r"^gfx[0-9]+(-[0-9]+)*-generic$")


@dataclass(frozen=True)
class GpuTarget:
    arch: str
    family: str
    wavefront: int
    integrated: bool
    first_rocm: str  # "" when no ROCm release supports it
    products: str
    known: bool = True


@cache
def catalog() -> dict[str, GpuTarget]:
    """All catalogued targets (loaded once per process; the data is immutable)."""
    text = resources.files("mlstack_ds").joinpath("gfx_targets.toml").read_text(encoding="utf-8")
    table = tomlcompat.loads(text)
    return {
        arch: GpuTarget(
            arch=arch,
            family=str(entry["family"]),
            wavefront=int(entry["wavefront"]),
            integrated=bool(entry["integrated"]),
            first_rocm=str(entry.get("first_rocm", "")),
            products=str(entry.get("products", "")),
        )
        for arch, entry in table.items()
    }


def is_generic(arch: str) -> bool:
    return bool(_GENERIC_RE.match(arch))


def is_valid_arch(arch: str) -> bool:
    """`gfx` + major (1-2 digits) + minor + stepping (hex digits), e.g. gfx90a, gfx1100."""
    return bool(_ARCH_RE.match(arch))


def base_arch(target_id: str) -> str:
    """`gfx90a:sramecc+:xnack-` -> `gfx90a`; also strips an `amdgcn-amd-amdhsa--` ISA prefix."""
    name = target_id.rsplit("--", 1)[-1]
    return name.split(":", 1)[0].strip()


def wavefront_for(arch: str) -> int | None:
    """Native wavefront size: the catalog's, else by generation (gfx9 and older wave64, gfx10+ wave32)."""
    entry = catalog().get(arch)
    if entry:
        return entry.wavefront
    match = _ARCH_RE.match(arch)
    if not match:
        return None
    return 64 if int(match.group(1)) <= 9 else 32


def lookup(arch: str) -> GpuTarget:
    """The catalog entry, or a best-effort entry marked `known=False` for an uncatalogued target."""
    entry = catalog().get(arch)
    if entry:
        return entry
    wave = wavefront_for(arch) or 0
    return GpuTarget(arch, "unknown", wave, False, "", "", known=False)


# Families whose matrix units compute bf16 natively: MI100 (CDNA1) onwards, RDNA3 (WMMA) onwards. Older
# targets (GCN5, RDNA1/2) run bf16 emulated, slower than fp16, so `config` picks fp16 there.
BF16_FAMILIES = frozenset({"CDNA1", "CDNA2", "CDNA3", "CDNA4", "RDNA3", "RDNA3.5", "RDNA4"})


def supports_bf16(arch: str) -> bool:
    """Whether the target computes bf16 natively (by its catalogued family; unknown targets: no)."""
    return lookup(arch).family in BF16_FAMILIES


def arch_from_override(value: str) -> str | None:
    """`HSA_OVERRIDE_GFX_VERSION=10.3.0` -> `gfx1030`; `9.0.10` -> `gfx90a` (minor/stepping are hex)."""
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    major, minor, stepping = (int(p) for p in parts)
    if minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def rocm_supports(arch: str, rocm_version: str) -> bool | None:
    """Whether `rocm_version` is at least the target's first supporting release (None: unknown)."""
    entry = catalog().get(arch)
    if not entry or not entry.first_rocm:
        return None
    try:
        return Version(rocm_version) >= Version(entry.first_rocm)
    except InvalidVersion:
        return None


def arch_sort_key(arch: str) -> tuple[int, int, int, str]:
    """gfx<major><minor><stepping>: the last two characters are minor and (hex) stepping, so that
    gfx900 < gfx90a < gfx942 < gfx1030 < gfx1100 (string order would put gfx1100 before gfx900)."""
    digits = arch.removeprefix("gfx")
    try:
        return int(digits[:-2]), int(digits[-2], 16), int(digits[-1], 16), ""
    except (ValueError, IndexError):
        return 1 << 30, 0, 0, arch


def sorted_archs(archs: Iterable[str]) -> list[str]:
    return sorted(archs, key=arch_sort_key)


def discrete_else_all(gpus: Sequence[G], integrated: Callable[[G], bool]) -> list[G]:
    """The discrete GPUs, or all of them when there are none: an iGPU next to a dGPU is left out of
    builds and plans (it would add a target and a wavefront for a device nobody trains on)."""
    discrete = [g for g in gpus if not integrated(g)]
    return discrete or list(gpus)


def wavefront_groups(placed_archs: Iterable[tuple[str, T]]) -> dict[int, list[T]]:
    """`(arch, where)` pairs grouped by the arch's wavefront size, each `where` once, in order; archs of
    unknown size are left out. More than one group is a mix one DeepSpeed build cannot serve: its ROCm
    kernels are compiled with one `ROCM_WAVEFRONT_SIZE`."""
    groups: dict[int, list[T]] = {}
    for arch, where in placed_archs:
        size = wavefront_for(arch)
        if size is not None and where not in groups.setdefault(size, []):
            groups[size].append(where)
    return groups


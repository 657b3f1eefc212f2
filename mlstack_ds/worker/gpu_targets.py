"""Which built GPU targets run on which GPU: ROCm target ids with their features, CUDA capabilities with `a`/`f`/`+PTX`.

One reading for the plan (does `TORCH_CUDA_ARCH_LIST` leave out a detected GPU?) and for verify's `environment`
check (does the install have code for every GPU here?), so the two cannot disagree. Standard library only: it
runs inside the target interpreter as part of the worker; torch is passed in, never imported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

UNKNOWN = "unknown"  # a ROCm torch too old to report gcnArchName
# `9.0`, `9.0a` (arch-specific), `10.0f` (family-specific), each with an optional `+PTX`.
CUDA_TARGET = re.compile(r"(?P<major>\d+)\.(?P<minor>\d+)(?P<kind>[af]?)(?P<ptx>\+PTX)?")


@dataclass(frozen=True)
class CudaTarget:
    major: int
    minor: int
    kind: str  # "": portable SASS, "a": arch-specific (this X.Y only), "f": family-specific (X.z, z >= Y)
    ptx: bool

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.kind}"


def parse_cuda_target(text: str) -> CudaTarget | None:
    """`9.0a+PTX` -> its parts; None for anything else (a named arch such as `Hopper`, junk)."""
    match = CUDA_TARGET.fullmatch(text.strip())
    if match is None:
        return None
    return CudaTarget(int(match["major"]), int(match["minor"]), match["kind"], bool(match["ptx"]))


def cuda_runs(built: str, device: str) -> str | None:
    """How code built for `built` runs on a GPU of capability `device` (`9.0`), or None when it cannot.

    SASS for X.Y runs on X.z with z >= Y; `X.Ya` only on exactly X.Y; `X.Yf` on the family, X.z with z >= Y.
    PTX of a plain X.Y is JIT-compiled by the driver for any newer GPU; arch- and family-specific PTX is not
    forward compatible, so it adds nothing beyond its SASS."""
    target, gpu = parse_cuda_target(built), parse_cuda_target(device)
    if target is None or gpu is None:
        return None
    same_major = gpu.major == target.major  # SASS never crosses a major version
    if same_major and (gpu.minor == target.minor if target.kind == "a" else gpu.minor >= target.minor):
        return f"{target.sm} code"
    if target.ptx and not target.kind and (gpu.major, gpu.minor) >= (target.major, target.minor):
        return f"PTX of {target.major}.{target.minor}, JIT-compiled at first load (a slower start)"
    return None


def split_gfx(target_id: str) -> tuple[str, dict[str, str]]:
    """`amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-` -> (`gfx90a`, {sramecc: +, xnack: -})."""
    name = target_id.strip().rsplit("--", 1)[-1]
    base, *features = name.split(":")
    return base, {f[:-1]: f[-1] for f in features if len(f) > 1 and f[-1] in "+-"}


def rocm_runs(built: str, device: str) -> str | None:
    """How code built for `built` (`gfx90a`, `gfx90a:xnack-`) runs on the GPU `device` (its full target id),
    or None: the base gfx must match and each feature the built target names must be the device's setting;
    a feature left out was compiled for either setting."""
    built_base, built_features = split_gfx(built)
    device_base, device_features = split_gfx(device)
    if built_base != device_base:
        return None
    if any(device_features.get(name) != value for name, value in built_features.items()):
        return None
    return f"{built} code"


def runs_on(built: str, device: str) -> str | None:
    """Either platform's rule, told apart by the device: `gfx...` is ROCm, `X.Y` is CUDA."""
    if device.strip().rsplit("--", 1)[-1].startswith("gfx"):
        return rocm_runs(built, device)
    return cuda_runs(built, device)


def coverage(built: Sequence[str], devices: Iterable[str]) -> dict[str, str | None]:
    """Each distinct device target -> how the first built target that runs on it does so (SASS before PTX),
    None when none does."""
    result: dict[str, str | None] = {}
    for device in dict.fromkeys(devices):
        ways = [how for how in (runs_on(target, device) for target in built) if how]
        result[device] = next((how for how in ways if "PTX" not in how), ways[0] if ways else None)
    return result


def device_targets(torch: Any) -> list[str]:
    """What each visible GPU is, in the receipt's terms: ROCm's full target id (`gfx90a:sramecc+:xnack-`), CUDA's
    compute capability (`9.0`). Not `gcnArchName` on CUDA: torch fills it with the device's name there."""
    if not torch.cuda.is_available():
        return []
    rocm = bool(getattr(torch.version, "hip", None))
    targets = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        if rocm:
            target = str(getattr(props, "gcnArchName", "") or "").strip().rsplit("--", 1)[-1]
            targets.append(target if target.startswith("gfx") else UNKNOWN)
        else:
            targets.append(f"{props.major}.{props.minor}")
    return targets

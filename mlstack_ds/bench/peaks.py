"""AMD GPUs' peak dense FP16/BF16 rates (peaks.toml), each with its source: the ceiling a throughput claim
is judged against.

Why a table of products and not of `gfx` targets: one target covers cards of very different speed (gfx90a
is both the MI210 and the MI250X), so a rate belongs to a product; the target is kept to find the
products a detected GPU may be.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from mlstack_ds.tomlcompat import tomllib


@dataclass(frozen=True)
class GpuPeak:
    name: str
    arch: str
    vram_gib: float  # per device
    devices: int  # ROCm devices per product (an MI250X shows two)
    fp16_tflops: float  # the product's, dense
    bf16_tflops: float
    derived: bool  # computed from AMD's published CUs and clocks, not a number AMD prints
    source: str
    basis: str

    @property
    def per_device_flops(self) -> float:
        """Peak dense 16-bit FLOP/s of one ROCm device: the higher of FP16 and BF16 (a claim is given the
        faster precision, since the guide states none)."""
        return max(self.fp16_tflops, self.bf16_tflops) * 1e12 / self.devices

    @property
    def vram_bytes(self) -> int:
        return int(self.vram_gib * 2**30)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "per_device_tflops": self.per_device_flops / 1e12, "sparsity": "excluded"}


@cache
def load_peaks() -> tuple[GpuPeak, ...]:
    text = resources.files("mlstack_ds.bench").joinpath("peaks.toml").read_text(encoding="utf-8")
    return tuple(GpuPeak(str(g["name"]), str(g["arch"]), float(g["vram_gib"]), int(g["devices"]),
                         float(g["fp16_tflops"]), float(g["bf16_tflops"]), bool(g["derived"]), str(g["source"]),
                         str(g["basis"]))
                 for g in tomllib.loads(text)["gpu"])


def peak_named(name: str) -> GpuPeak:
    """The entry whose name contains `name` (case-insensitive), e.g. "7900 XTX"; KeyError if none or several."""
    found = [p for p in load_peaks() if name.lower() in p.name.lower()]
    if len(found) != 1:
        raise KeyError(f"{name!r} names {len(found)} GPUs of peaks.toml")
    return found[0]

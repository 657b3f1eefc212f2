"""Parse `nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits` (pure)."""

from __future__ import annotations

from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.detect.text import clean_lines

NVIDIA_SMI_QUERY = ("--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits")


def parse_nvidia_smi_csv(text: str) -> list[GpuAgent]:
    gpus = []
    for line in clean_lines(text):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0]:
            continue
        name, capability, memory_mib = fields[0], fields[1], fields[2]
        arch = "sm_" + capability.replace(".", "") if capability.replace(".", "").isdigit() else ""
        vram = int(float(memory_mib) * 1024 * 1024) if memory_mib.replace(".", "").isdigit() else None
        gpus.append(
            GpuAgent(
                index=len(gpus), arch=arch, target_id=capability, name=name, wavefront_size=32,
                compute_units=None, vram_bytes=vram, integrated=False, node=None, vendor="nvidia",
                family="cuda", source="nvidia-smi",
            )
        )
    return gpus

"""Parsers for the fallback GPU sources, used when rocminfo is missing or fails (pure functions).

`amd-smi list` knows the devices but not their ISA; `rocm_agent_enumerator` knows the ISAs (with a
`gfx000` line per CPU agent in older releases); `rocm-smi --showproductname` knows both. `merge`
puts together whatever answered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlstack_ds import gfx
from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.detect.text import clean_lines, leading_int


@dataclass(frozen=True)
class SmiDevice:
    index: int
    node: int | None = None
    uuid: str | None = None
    bdf: str | None = None
    name: str = ""
    arch: str = ""


def parse_amd_smi_list(text: str) -> list[SmiDevice]:
    """`amd-smi list`: blocks of `GPU: N` followed by indented `KEY: value` lines."""
    devices: list[dict[str, str]] = []
    for line in clean_lines(text):
        header = re.match(r"^\s*GPU:\s*(\d+)\s*$", line)
        if header:
            devices.append({"index": header.group(1)})
            continue
        pair = re.match(r"^\s+([A-Z_]+):\s*(.*)$", line)
        if pair and devices:
            devices[-1][pair.group(1)] = pair.group(2).strip()
    return [
        SmiDevice(
            index=int(d["index"]),
            node=leading_int(d.get("NODE_ID", "")),
            uuid=d.get("UUID") or None,
            bdf=d.get("BDF") or None,
        )
        for d in devices
    ]


def parse_rocm_agent_enumerator(text: str) -> list[str]:
    """One ISA per line; `gfx000` is the CPU agent (older releases) and is dropped."""
    archs = []
    for line in clean_lines(text):
        token = line.strip()
        if gfx.is_valid_arch(token) and token != "gfx000":
            archs.append(token)
    return archs


def parse_rocm_smi_productname(text: str) -> list[SmiDevice]:
    """`rocm-smi --showproductname`: `GPU[0]\\t\\t: Card Series: \\t\\tInstinct MI210` lines."""
    found: dict[int, dict[str, str]] = {}
    for line in clean_lines(text):
        match = re.match(r"^\s*GPU\[(\d+)\]\s*:\s*([^:]+?):\s*(.*)$", line)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2).strip()] = match.group(3).strip()
    return [
        SmiDevice(
            index=index,
            node=leading_int(fields.get("Node ID", "")),
            name=fields.get("Card Series", "") or fields.get("Card series", ""),
            arch=gfx.base_arch(fields.get("GFX Version", "")) if fields.get("GFX Version") else "",
        )
        for index, fields in sorted(found.items())
    ]


def merge(
    listed: list[SmiDevice], named: list[SmiDevice], enumerated_archs: list[str], source: str
) -> list[GpuAgent]:
    """Combine fallback sources by device index; archs from rocm-smi, else from the enumerator order."""
    count = max(len(listed), len(named), len(enumerated_archs))
    gpus = []
    for index in range(count):
        base = listed[index] if index < len(listed) else SmiDevice(index)
        extra = named[index] if index < len(named) else SmiDevice(index)
        arch = extra.arch or (enumerated_archs[index] if index < len(enumerated_archs) else "")
        target = gfx.lookup(arch) if arch else None
        gpus.append(
            GpuAgent(
                index=index,
                arch=arch,
                target_id=arch,
                name=extra.name,
                wavefront_size=target.wavefront if target and target.wavefront else None,
                compute_units=None,
                vram_bytes=None,
                integrated=bool(target and target.integrated),
                node=base.node if base.node is not None else extra.node,
                family=target.family if target else "unknown",
                uuid=base.uuid,
                source=source,
            )
        )
    return gpus

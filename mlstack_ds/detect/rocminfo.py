"""Parse `rocminfo` output into agents (pure: text in, dataclasses out).

Why not "first `gfx` match" like upstream DeepSpeed: a machine may have several GPUs, an iGPU next
to a dGPU, CPU agents first, and generic ISAs listed besides the real one. Every agent is parsed;
damaged pastes (truncated, colour codes, CRLF, stray lines) give what can be read, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mlstack_ds import gfx
from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.detect.text import clean_lines, leading_int

_AGENT_HEADER_RE = re.compile(r"^\s*m?Agent\s+(\d+)\s*$")
_KEY_VALUE_RE = re.compile(r"^(\s*)([^:]+?):\s?(.*)$")
# Marketing names of Radeon iGPUs ("Radeon 680M", "Radeon 780M"); used only when the arch is spoofed.
_IGPU_NAME_RE = re.compile(r"Radeon\s+\d{3,4}M\b")


@dataclass
class RocminfoAgent:
    """One `Agent N` block, as far as it could be read."""

    number: int
    fields: dict[str, str] = field(default_factory=dict)
    isa_names: list[str] = field(default_factory=list)
    pools: list[dict[str, str]] = field(default_factory=list)

    @property
    def device_type(self) -> str:
        declared = self.fields.get("Device Type", "").strip().upper()
        if declared:
            return declared
        # Truncated before "Device Type": infer from what is there.
        if gfx.is_valid_arch(self.fields.get("Name", "").strip()) or self.isa_names:
            return "GPU"
        if self.fields.get("Vendor Name", "").strip().upper() == "CPU":
            return "CPU"
        return ""

    def int_field(self, key: str) -> int | None:
        return leading_int(self.fields.get(key, ""))


def parse_rocminfo(text: str) -> list[RocminfoAgent]:
    """All agents in order of appearance (CPU agents included; callers filter)."""
    agents: list[RocminfoAgent] = []
    current: RocminfoAgent | None = None
    section = ""
    for line in clean_lines(text):
        header = _AGENT_HEADER_RE.match(line)
        if header:
            current = RocminfoAgent(number=int(header.group(1)))
            agents.append(current)
            section = ""
            continue
        if current is None or not line.strip() or set(line.strip()) <= {"*", "="}:
            continue
        stripped = line.strip()
        if re.fullmatch(r"ISA \d+", stripped):
            continue
        if re.fullmatch(r"Pool \d+", stripped):
            current.pools.append({})
            continue
        match = _KEY_VALUE_RE.match(line)
        if not match:
            continue
        key, value = match.group(2).strip(), match.group(3).strip()
        if key in ("Pool Info", "ISA Info", "Cache Info"):
            section = key
            continue
        if section == "ISA Info" and key == "Name":
            current.isa_names.append(value)
        elif key == "Segment":
            # A pool starts at its Segment line even when the "Pool Info:" header was lost.
            section = "Pool Info"
            if not current.pools or "Segment" in current.pools[-1]:
                current.pools.append({})
            current.pools[-1]["Segment"] = value
        elif section == "Pool Info" and key in ("Segment", "Size", "Allocatable"):
            if not current.pools:
                current.pools.append({})
            current.pools[-1].setdefault(key, value)
        elif section != "ISA Info":
            current.fields.setdefault(key, value)
    return agents


def _vram_bytes(agent: RocminfoAgent) -> int | None:
    """Size of the first coarse-grained GLOBAL pool: the device's own memory (KB in rocminfo)."""
    for pool in agent.pools:
        segment = pool.get("Segment", "").upper()
        if segment.startswith("GLOBAL") and "COARSE GRAINED" in segment:
            size_kb = leading_int(pool.get("Size", ""))
            if size_kb is not None:
                return size_kb * 1024
    return None


def _real_uuid(value: str) -> str | None:
    """rocminfo prints `GPU-XX` for devices without a unique id (APUs, old cards)."""
    value = value.strip()
    return None if not value or value.endswith("-XX") else value


def gpu_agents(agents: list[RocminfoAgent], hsa_override: str | None = None) -> list[GpuAgent]:
    """The GPU agents as `GpuAgent`s, indexed in the order HIP enumerates them."""
    gpus: list[GpuAgent] = []
    for agent in agents:
        if agent.device_type != "GPU":
            continue
        isa_targets = [
            name.rsplit("--", 1)[-1] for name in agent.isa_names if not gfx.is_generic(gfx.base_arch(name))
        ]
        name_field = agent.fields.get("Name", "").strip()
        target_id = isa_targets[0] if isa_targets else (name_field if gfx.is_valid_arch(name_field) else "")
        arch = gfx.base_arch(target_id) if target_id else ""
        target = gfx.lookup(arch) if arch else None
        marketing = agent.fields.get("Marketing Name", "").strip()
        spoofed = bool(hsa_override)
        integrated = "APU" in agent.fields.get("Memory Properties", "").upper() or bool(
            target and target.integrated
        )
        if spoofed and _IGPU_NAME_RE.search(marketing):
            integrated = True
        wavefront = agent.int_field("Wavefront Size") or (gfx.wavefront_for(arch) if arch else None)
        gpus.append(
            GpuAgent(
                index=len(gpus),
                arch=arch,
                target_id=target_id,
                name=marketing or name_field,
                wavefront_size=wavefront,
                compute_units=agent.int_field("Compute Unit"),
                vram_bytes=_vram_bytes(agent),
                integrated=integrated,
                node=agent.int_field("Node"),
                vendor="amd",
                family=target.family if target else "unknown",
                uuid=_real_uuid(agent.fields.get("Uuid", "")),
                source="rocminfo",
                spoofed=spoofed,
            )
        )
    return gpus

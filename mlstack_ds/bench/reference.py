"""The guide's reference numbers (reference.toml) and when a measured run may stand beside them.

A number is compared only with a run of the same model, stage and world size on the same GPU target with
the same memory; anything else is reported as not comparable, with the reason, never as a ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.config.hardware import detect_gpus
from mlstack_ds.tomlcompat import tomllib

REFERENCE_FILE = Path(__file__).with_name("reference.toml")


@dataclass(frozen=True)
class ReferenceEntry:
    model: str
    stage: str
    world_size: int
    metric: str
    value: float
    quoted_in: str
    caveat: str


@dataclass(frozen=True)
class Reference:
    source: dict[str, Any]
    entries: tuple[ReferenceEntry, ...]


def load_reference(path: Path = REFERENCE_FILE) -> Reference:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = tuple(ReferenceEntry(str(e["model"]), str(e["stage"]), int(e["world_size"]), str(e["metric"]),
                                   float(e["value"]), str(e.get("quoted_in", "")), str(e.get("caveat", "")))
                    for e in data.get("entries", []))
    return Reference(dict(data["source"]), entries)


@dataclass(frozen=True)
class Machine:
    """What this run ran on, for the comparability test: platform, GPU target and memory per device."""

    platform: str  # cpu | gpu
    arch: str | None
    vram_gib: float | None


def this_machine(platform: str) -> Machine:
    """The machine a run on `platform` (cpu | gpu) had: the first GPU's target, the smallest GPU memory."""
    gpus = detect_gpus() if platform == "gpu" else []
    vram = min((g.vram_bytes for g in gpus if g.vram_bytes), default=None)
    return Machine(platform, gpus[0].arch if gpus else None, vram / 2**30 if vram else None)


def differences(reference: Reference, machine: Machine, model: str, world_size: int) -> list[str]:
    """Why this run cannot stand beside the reference; empty when it can."""
    source = reference.source
    found = []
    if machine.platform == "cpu":
        found.append(f"this run is on CPU; the reference is {source['gpus']}x {source['hardware'].split('x ', 1)[-1]}")
    elif machine.arch != source.get("arch"):
        found.append(f"GPU target {machine.arch or 'unknown'}, the reference's is {source.get('arch')}")
    elif machine.vram_gib is not None and round(machine.vram_gib) != int(source.get("vram_gib", 0)):
        found.append(f"{machine.vram_gib:.0f} GiB per GPU, the reference's {source.get('vram_gib')} GiB")
    if world_size != int(source.get("gpus", 0)):
        found.append(f"{world_size} rank(s), the reference ran on {source.get('gpus')}")
    if model not in {e.model for e in reference.entries}:
        found.append(f"model {model}: the reference has no stored value for it")
    return found


def compare(reference: Reference, machine: Machine, model: str, world_size: int,
            measured: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """`measured`: stage -> metric -> value. Returns the comparison document (`--json`'s "comparison")."""
    why_not = differences(reference, machine, model, world_size)
    rows = []
    for entry in reference.entries:
        if entry.model != model or entry.world_size != world_size:
            continue
        ours = measured.get(entry.stage, {}).get(entry.metric)
        rows.append({"model": entry.model, "stage": entry.stage, "metric": entry.metric, "reference": entry.value,
                     "measured": ours if not why_not else None, "quoted_in": entry.quoted_in,
                     "caveat": entry.caveat})
    return {"source": reference.source, "comparable": not why_not, "differences": why_not, "rows": rows,
            "stored_entries": len(reference.entries)}

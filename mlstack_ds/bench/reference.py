"""When a measured run may stand beside the guide's cells (guide.toml), and the rows that put them there.

A cell is set beside a measurement only for the same model, stage and world size on the same GPU target
with the same memory; otherwise the guide's cell is still shown with its verdict, but never a measured
value next to it (no ratio across different hardware).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlstack_ds.bench.guide import Guide
from mlstack_ds.bench.verdicts import VERDICTS, Verdict
from mlstack_ds.config.hardware import detect_gpus

# The guide's cell kinds a bench run measures, and the key of the run's numbers for each.
MEASURED_METRIC = {"rate": "samples_per_s", "memory": "peak_memory_gb_per_gpu"}


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


def differences(guide: Guide, machine: Machine, model: str, world_size: int) -> list[str]:
    """Why this run cannot stand beside the guide's cells; empty when it can."""
    source = guide.source
    found = []
    if machine.platform == "cpu":
        found.append(f"this run is on CPU; the guide's is {source['hardware']}")
    elif machine.arch != source.get("arch"):
        found.append(f"GPU target {machine.arch or 'unknown'}, the guide's is {source.get('arch')}")
    elif machine.vram_gib is not None and round(machine.vram_gib) != int(source.get("vram_gib", 0)):
        found.append(f"{machine.vram_gib:.0f} GiB per GPU, the guide's {source.get('vram_gib')} GiB")
    if world_size != int(source.get("gpus", 0)):
        found.append(f"{world_size} rank(s), the guide ran on {source.get('gpus')}")
    if model not in {c.model for c in guide.cells if c.model}:
        found.append(f"model {model}: not one of the guide's sizes")
    return found


def _row(verdict: Verdict, measured: float | None) -> dict[str, Any]:
    cell = verdict.cell
    return {"id": cell.id, "model": cell.model, "stage": cell.stage, "world_size": cell.world_size,
            "metric": MEASURED_METRIC.get(cell.kind, cell.kind), "reference": cell.value,
            "reference_value": cell.number(), "measured": measured, "verdict": verdict.verdict,
            "verdict_text": VERDICTS[verdict.verdict], "reason": verdict.reason}


def compare(guide: Guide, verdicts: list[Verdict], machine: Machine, model: str, *, world_size: int,
            measured: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """`measured`: stage -> metric -> value. The guide's throughput and memory cells of this model and world
    size, each with its verdict and, on the guide's hardware, the measured value beside it
    (`--json`'s "comparison" entry for this world size)."""
    why_not = differences(guide, machine, model, world_size)
    rows = []
    for verdict in verdicts:
        cell = verdict.cell
        if cell.table not in ("throughput", "memory") or cell.kind not in MEASURED_METRIC:
            continue
        if cell.model != model or cell.world_size != world_size:
            continue
        ours = measured.get(str(cell.stage), {}).get(MEASURED_METRIC[cell.kind])
        rows.append(_row(verdict, ours if not why_not else None))
    return {"source": guide.source, "world_size": world_size, "comparable": not why_not, "differences": why_not,
            "rows": rows}


def compare_scaling(guide: Guide, verdicts: list[Verdict], scaling_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The guide's scaling cell beside each measured efficiency (same stage and world size), with its
    verdict and what its efficiency would make of the measured baseline rate: the rate the guide's number
    implies on this machine, beside the one measured."""
    by_key = {(v.cell.stage, v.cell.world_size): v for v in verdicts if v.cell.table == "scaling"}
    rows = []
    for row in scaling_rows:
        verdict = by_key.get((row["stage"], row["world_size"]))
        if verdict is None or row["world_size"] == row["baseline_world_size"]:
            continue
        efficiency = float(verdict.cell.number() or 0) / 100
        base_rate = row["samples_per_s"] / (row["efficiency"] * row["world_size"]) * row["baseline_world_size"]
        implied = base_rate / row["baseline_world_size"] * row["world_size"] * efficiency
        rows.append({"stage": row["stage"], "world_size": row["world_size"], "reference": verdict.cell.value,
                     "measured_efficiency": row["efficiency"], "implied_samples_per_s": implied,
                     "measured_samples_per_s": row["samples_per_s"], "verdict": verdict.verdict,
                     "verdict_text": VERDICTS[verdict.verdict], "reason": verdict.reason})
    return rows

"""A bench's numbers: throughput with its spread, memory per rank, model TFLOP/s, scaling, the comparison.

Throughput comes from rank 0's step times (every step ends with a barrier on all ranks, so every rank's
time is the same): samples per step ÷ the median step time, with the slowest and fastest step as the
spread. Memory is per rank: peak accelerator memory on GPUs, peak RSS on CPU, and beside it the bytes of
live tensors after the last step (model states, buffers, ZeRO's partitions and bucket buffers, which RSS
shows only once they are written to).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlstack_ds.bench.guide import load_guide
from mlstack_ds.bench.reference import Machine, compare, compare_scaling
from mlstack_ds.bench.run import StageRun, stage_label
from mlstack_ds.bench.spec import BenchSpec
from mlstack_ds.bench.verdicts import judge_guide
from mlstack_ds.console import print_records

SCHEMA = 1


@dataclass(frozen=True)
class StageNumbers:
    world_size: int
    stage: str
    status: str
    reason: str
    samples_per_s: dict[str, float] | None  # median, min, max
    tokens_per_s: float | None
    model_tflops_per_s: float | None
    peak_memory_bytes: list[int | None]  # per rank
    peak_memory_kind: str  # accelerator | rss
    live_tensor_bytes: list[int | None]
    precision: str | None
    params: int | None
    flops_per_sample: int | None
    step_times_s: list[float]
    duration_s: float
    hosts: list[str | None]  # each rank's node

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def stage_numbers(run: StageRun, spec: BenchSpec) -> StageNumbers:
    first = run.ranks.get(0, {})
    ranks = [run.ranks.get(rank, {}) for rank in range(run.world_size)]
    kind = "accelerator" if any(r.get("peak_accelerator_bytes") is not None for r in ranks) else "rss"
    peaks = [r.get("peak_accelerator_bytes") if kind == "accelerator" else r.get("peak_rss_bytes") for r in ranks]
    times = [float(t) for t in first.get("step_times_s") or []]
    rate = tokens = tflops = None
    if run.status == "ok" and times:
        samples = int(first.get("samples_per_step", 0))
        median = statistics.median(times)
        rate = {"median": samples / median, "min": samples / max(times), "max": samples / min(times)}
        tokens = rate["median"] * spec.seq_len
        if first.get("flops_per_sample"):
            tflops = rate["median"] * int(first["flops_per_sample"]) / 1e12
    return StageNumbers(run.world_size, run.stage, run.status, run.reason, rate, tokens, tflops, peaks, kind,
                        [r.get("live_tensor_bytes") for r in ranks], first.get("precision"), first.get("params"),
                        first.get("flops_per_sample"), times, run.duration_s, [r.get("host") for r in ranks])


def scaling(numbers: Sequence[StageNumbers]) -> list[dict[str, Any]]:
    """Per stage, each world size's throughput per rank against the smallest world size's (1.0 = linear)."""
    rows = []
    for stage in dict.fromkeys(n.stage for n in numbers):
        measured = sorted((n.world_size, n.samples_per_s["median"]) for n in numbers
                          if n.stage == stage and n.samples_per_s)
        if len(measured) < 2:
            continue
        base_size, base_rate = measured[0]
        for size, rate in measured:
            rows.append({"stage": stage, "world_size": size, "samples_per_s": rate,
                         "efficiency": (rate / size) / (base_rate / base_size), "baseline_world_size": base_size})
    return rows


def build_report(spec: BenchSpec, runs: Sequence[StageRun], python: str, machine: Machine) -> dict[str, Any]:
    numbers = [stage_numbers(run, spec) for run in runs]
    by_size: dict[int, dict[str, dict[str, float | None]]] = {}
    for n in numbers:
        peak = max((p for p in n.peak_memory_bytes if p is not None), default=None)
        by_size.setdefault(n.world_size, {})[n.stage] = {
            "samples_per_s": n.samples_per_s["median"] if n.samples_per_s else None,
            "peak_memory_gb_per_gpu": peak / 1e9 if peak is not None and n.peak_memory_kind == "accelerator" else None}
    guide = load_guide()
    verdicts = judge_guide(guide)
    comparisons = [compare(guide, verdicts, machine, spec.model.name, world_size=size, measured=measured)
                   for size, measured in by_size.items()]
    scaled = scaling(numbers)
    return {"schema": SCHEMA, "python": python, "machine": machine.__dict__, "spec": spec.to_json(),
            "runs": [n.to_json() for n in numbers], "scaling": scaled, "comparison": comparisons,
            "scaling_reference": compare_scaling(guide, verdicts, scaled),
            "ok": all(n.status in ("ok", "oom") for n in numbers)}


def _gb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


def _guide_cells(report: dict[str, Any]) -> dict[tuple[int, str, str], dict[str, Any]]:
    """(world size, stage, metric) -> the guide's row, where the run is comparable with the guide."""
    return {(c["world_size"], row["stage"], row["metric"]): row for c in report["comparison"] if c["comparable"]
            for row in c["rows"]}


def _beside(row: dict[str, Any] | None) -> str:
    return "-" if row is None else f"{row['reference']} ({row['verdict']})"


def render(report: dict[str, Any], console: Any) -> None:
    memory_column = "peak GB/rank" if any(r["peak_memory_kind"] == "accelerator" for r in report["runs"]) \
        else "peak RSS GB/rank"
    guide = _guide_cells(report)
    columns = ["stage", "ranks", "samples/s (min-max)", "tokens/s", "model TFLOP/s", memory_column, "tensors GB/rank"]
    if guide:
        columns[3:3] = ["guide samples/s"]
        columns.append("guide GB/GPU")
    rows = []
    for run in report["runs"]:
        rate = run["samples_per_s"]
        peaks = [p for p in run["peak_memory_bytes"] if p is not None]
        live = [p for p in run["live_tensor_bytes"] if p is not None]
        shown = ("OOM" if run["status"] == "oom" else "FAILED" if rate is None
                 else f"{rate['median']:.2f} ({rate['min']:.2f}-{rate['max']:.2f})")
        row = [stage_label(run["stage"]), str(run["world_size"]), shown,
               "-" if run["tokens_per_s"] is None else f"{run['tokens_per_s']:.0f}",
               "-" if run["model_tflops_per_s"] is None else f"{run['model_tflops_per_s']:.4f}",
               _gb(max(peaks)) if peaks else "-", _gb(max(live)) if live else "-"]
        if guide:
            key = (run["world_size"], run["stage"])
            row[3:3] = [_beside(guide.get((*key, "samples_per_s")))]
            row.append(_beside(guide.get((*key, "peak_memory_gb_per_gpu"))))
        rows.append(row)
    spec = report["spec"]
    print_records(console, columns, rows, title=f"bench: {spec['model']['name']}, micro-batch "
                  f"{spec['micro_batch']}, sequence {spec['seq_len']}, {spec['steps']} timed steps")
    for note in notes(report):
        console.print(note, markup=False, highlight=False, soft_wrap=True)


def notes(report: dict[str, Any]) -> list[str]:
    """What the table cannot hold: failures, scaling against the guide's, and every guide cell's verdict."""
    found = [f"{stage_label(run['stage'])} on {run['world_size']} rank(s): {run['reason']}"
             for run in report["runs"] if run["status"] != "ok"]
    guide_scaling = {(r["stage"], r["world_size"]): r for r in report.get("scaling_reference", [])}
    for row in report["scaling"]:
        if row["world_size"] == row["baseline_world_size"]:
            continue
        line = (f"scaling {stage_label(row['stage'])}: {row['world_size']} ranks at {row['efficiency']:.0%} of linear "
                f"from {row['baseline_world_size']}")
        theirs = guide_scaling.get((row["stage"], row["world_size"]))
        if theirs is not None:
            line += (f"; the guide's {theirs['reference']} would be {theirs['implied_samples_per_s']:.2f} samples/s "
                     f"from this baseline, {theirs['measured_samples_per_s']:.2f} measured (guide's cell: "
                     f"{theirs['verdict']})")
        found.append(line)
    for comparison in report["comparison"]:
        source = comparison["source"]
        if not comparison["comparable"]:
            found.append(f"not comparable with the guide's tables ({source['hardware']}, ROCm {source['rocm']}, "
                         f"torch {source['torch']}): {'; '.join(comparison['differences'])}")
        found += [f"guide {row['id']} = {row['reference']}: {row['verdict_text']}: {row['reason']}"
                  for row in comparison["rows"]]
    return found

"""A verdict on every cell of the guide's tables, computed from physics.py's formulas, never typed in.

Memory cells: the ZeRO paper's model states per GPU for the stated stage and GPU count, against the claim
and the card. Throughput cells: the longest sequence at which the claimed rate stays within the GPUs'
peak dense 16-bit rate (peaks.toml), since the guide states no sequence length. Scaling cells: what the
2-GPU rates of the throughput table imply for one GPU. Computed cells (speedups, reductions, the version
table's improvements): their arithmetic, then the worst verdict of the cells they are computed from.
Every bound is the one most favourable to the guide (100% of peak, the faster precision, no activation
recomputation, the ZeRO paper's minimum rather than DeepSpeed's larger estimate), so "impossible" is
impossible under any reading of the unstated conditions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mlstack_ds.bench.guide import Cell, Guide, load_guide
from mlstack_ds.bench.peaks import GpuPeak, load_peaks, peak_named
from mlstack_ds.bench.physics import (
    deepspeed_estimate,
    flops_per_sample,
    longest_sequence,
    offload_floor,
    zero_model_states,
)
from mlstack_ds.config.model import PRESETS, ModelShape
from mlstack_ds.config.rules import ROCM_FP16_INITIAL_SCALE_POWER, ROCM_SMALL_GPU_BUCKET_SIZE

SCHEMA = 1
# The verdicts, from best to worst (a computed cell takes the worst of its inputs), with what each says.
VERDICTS: dict[str, str] = {
    "consistent": "consistent with the physics",
    "not-on-stated-hardware": "not measurable on the hardware the guide states",
    "short-sequences-only": "possible only at sequence lengths the table does not state",
    "needs-unstated-conditions": "possible only under conditions the table does not state",
    "needs-offload": "needs offload the table does not mention",
    "arithmetic-off": "does not follow from the cells it is computed from",
    "impossible": "impossible",
}
# The GPT-3 paper trained all four shapes with 2048-token sequences: a rate that is possible only with much
# shorter ones is not a rate of these models as they are trained.
CONTEXT_TOKENS = 2048
SINGLE_GPU_TOLERANCE = 0.01  # the table's rounding (one decimal, whole percents) is below 1%


@dataclass(frozen=True)
class Verdict:
    cell: Cell
    verdict: str
    reason: str
    numbers: dict[str, Any]

    def to_json(self, unit: str) -> dict[str, Any]:
        c = self.cell
        return {"id": c.id, "table": c.table, "row": c.row, "column": c.column, "value": c.value, "unit": unit,
                "kind": c.kind, "conditions": c.conditions(), "verdict": self.verdict,
                "verdict_text": VERDICTS[self.verdict], "reason": self.reason, "numbers": self.numbers}


def worst(verdicts: Iterable[str]) -> str:
    order = list(VERDICTS)
    return max(verdicts, key=order.index, default="consistent")


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def _stage(stage: str | None) -> str:
    return "plain PyTorch (DDP)" if stage == "ddp" else f"ZeRO-{stage}"


@dataclass(frozen=True)
class Judge:
    """The guide's machine, as the formulas need it: the GPU's peak and memory, and how many there were."""

    guide: Guide
    peak: GpuPeak
    gpus: int

    @property
    def vram(self) -> int:
        return int(float(self.guide.source["vram_gib"]) * 2**30)

    def shape(self, cell: Cell) -> ModelShape:
        return PRESETS[str(cell.model)]

    def states(self, cell: Cell, gpus: int | None = None) -> int:
        return zero_model_states(self.shape(cell).params, str(cell.stage), gpus or int(cell.world_size or 1))

    # --- cells that are measurements ----------------------------------------------------------------------

    def memory(self, cell: Cell) -> Verdict:
        shape, n, stage = self.shape(cell), int(cell.world_size or 1), str(cell.stage)
        states = self.states(cell)
        estimate = deepspeed_estimate(shape, stage, n)
        numbers: dict[str, Any] = {"params": shape.params, "model_states_bytes": states,
                                   "deepspeed_estimate_bytes": estimate, "vram_bytes": self.vram}
        where = f"{_stage(stage)} on {n} GPUs keeps {_gb(states)} of model states per GPU (ZeRO paper, " \
                f"{shape.params / 1e9:.2f}B parameters × 16 bytes{'' if stage == 'ddp' else ' partitioned'})"
        if estimate is not None:
            where += f"; DeepSpeed's estimator: {_gb(estimate)}"
        if cell.is_oom:
            return self._oom(cell, states, where, numbers)
        claimed = float(cell.number() or 0) * 1e9
        shown = f"{claimed / 1e9:g} GB"
        floor = offload_floor(shape, stage, n)
        numbers.update({"claimed_bytes": claimed, "offload_floor_bytes": floor})
        if claimed > self.vram:
            return Verdict(cell, "impossible", f"{shown} per GPU is more than the card's {_gb(self.vram)} "
                           f"({self.guide.source['vram_gib']} GiB); {where}", numbers)
        if states > self.vram:
            return Verdict(cell, "impossible", f"{where}: more than the card's {_gb(self.vram)} before any "
                           f"activation, and {_gb(states - claimed)} more than the claimed {shown}; only offload, "
                           "which the table does not mention, could move them off the GPU", numbers)
        if states > claimed:
            if floor is None or floor > claimed:
                return Verdict(cell, "impossible", f"{where}: above the claimed {shown}, and no offload of "
                               f"{_stage(stage)} gets below it", numbers)
            return Verdict(cell, "needs-offload", f"{where}: above the claimed {shown}; only with offload (down "
                           f"to {_gb(floor)}) could it read {shown}", numbers)
        note = "" if estimate is None or estimate <= claimed else \
            f" (DeepSpeed's more conservative estimate, {_gb(estimate)}, is above the claim)"
        return Verdict(cell, "consistent", f"{where}: {shown} leaves {_gb(claimed - states)} for activations and "
                       f"buffers, within the card's {_gb(self.vram)}{note}", numbers)

    def rate(self, cell: Cell) -> Verdict:
        shape, n = self.shape(cell), int(cell.world_size or 1)
        states = self.states(cell)
        numbers: dict[str, Any] = {"params": shape.params, "layers": shape.layers, "hidden": shape.hidden,
                                   "model_states_bytes": states, "vram_bytes": self.vram}
        if cell.is_oom:
            return self._oom(cell, states, f"{_stage(cell.stage)} on {n} GPUs keeps {_gb(states)} of model "
                             "states per GPU", numbers)
        rate = float(cell.number() or 0)
        peak = self.peak.per_device_flops * n
        longest = longest_sequence(rate, shape, peak)
        at_context = rate * flops_per_sample(shape, CONTEXT_TOKENS)
        numbers.update({"samples_per_s": rate, "peak_flops": peak, "longest_seq_len": longest,
                        "longest_seq_len_at_half_peak": longest_sequence(rate, shape, peak / 2),
                        "flops_at_context": at_context, "percent_of_peak_at_context": 100 * at_context / peak})
        bound = (f"{rate:g} samples/s of {shape.params / 1e9:.2f}B parameters (L={shape.layers}, "
                 f"h={shape.hidden}) is 6·N·T + 12·L·h·T² FLOP per sample: within {n} × "
                 f"{self.peak.per_device_flops / 1e12:.1f} TFLOP/s only up to T = {longest} tokens at 100% of "
                 f"peak ({numbers['longest_seq_len_at_half_peak']} at 50%); at {CONTEXT_TOKENS} tokens it would "
                 f"be {numbers['percent_of_peak_at_context']:.0f}% of peak")
        if states > self.vram:
            return Verdict(cell, "impossible", f"the run cannot fit: {_stage(cell.stage)} on {n} GPUs keeps "
                           f"{_gb(states)} of model states per GPU, the card has {_gb(self.vram)}; and {bound}",
                           numbers)
        if longest < 1:
            return Verdict(cell, "impossible", bound, numbers)
        if longest < CONTEXT_TOKENS:
            return Verdict(cell, "short-sequences-only", f"{bound}; the table states no sequence length", numbers)
        return Verdict(cell, "consistent", bound, numbers)

    def _oom(self, cell: Cell, states: int, where: str, numbers: dict[str, Any]) -> Verdict:
        if states > self.vram:
            return Verdict(cell, "consistent", f"OOM as expected: {where}, more than the card's "
                           f"{_gb(self.vram)}", numbers)
        return Verdict(cell, "needs-unstated-conditions", f"{where}, which fits the card's {_gb(self.vram)}: "
                       "OOM needs activations of a sequence length or batch the table does not state", numbers)

    def efficiency(self, cell: Cell) -> Verdict:
        value, n = float(cell.number() or 0) / 100, int(cell.world_size or 1)
        numbers: dict[str, Any] = {"efficiency": value, "world_size": n, "stated_gpus": self.gpus}
        if n == 1:
            ok = abs(value - 1.0) < 1e-9
            return Verdict(cell, "consistent" if ok else "arithmetic-off",
                           "one GPU is the baseline: 100% by definition", numbers)
        if value > 1:
            return Verdict(cell, "needs-unstated-conditions", f"{cell.value} on {n} GPUs is superlinear, and the "
                           "guide gives no reason (a per-GPU batch that grew, a cache effect)", numbers)
        if n > self.gpus:
            return Verdict(cell, "not-on-stated-hardware", f"the guide's machine has {self.gpus} GPUs "
                           f"({self.guide.source['hardware']}); a {n}-GPU number was not measured on it, and the "
                           "guide names no other machine", numbers)
        return self._single_gpu(cell, value, n, numbers)

    def _single_gpu(self, cell: Cell, value: float, n: int, numbers: dict[str, Any]) -> Verdict:
        """What the throughput table's n-GPU rates imply for one GPU at this efficiency: rate_1 = rate_n ÷
        (n × E). On one GPU ZeRO partitions nothing, so a ZeRO run's single-GPU rate cannot beat plain
        PyTorch's without a difference the table does not state (precision, fused kernels, batch)."""
        found: list[str] = []
        verdicts: list[str] = []
        implied: dict[str, Any] = {}
        for rate_cell in self._rates(str(cell.stage), n):
            shape = self.shape(rate_cell)
            one_gpu = zero_model_states(shape.params, "ddp", 1)
            if one_gpu > self.vram:
                implied[rate_cell.row] = {"single_gpu_fits": False, "model_states_bytes": one_gpu}
                found.append(f"{rate_cell.row}: no single-GPU run exists ({_gb(one_gpu)} of model states)")
                continue
            single = float(rate_cell.number() or 0) / (n * value)
            longest = longest_sequence(single, shape, self.peak.per_device_flops)
            entry: dict[str, Any] = {"single_gpu_fits": True, "implied_single_gpu_samples_per_s": single,
                                     "longest_seq_len": longest}
            text = f"{rate_cell.row}: {rate_cell.value} ÷ ({n} × {value:.2f}) = {single:.1f} samples/s on one GPU, " \
                   f"possible up to T = {longest}"
            verdicts.append("short-sequences-only" if longest < CONTEXT_TOKENS else "consistent")
            plain = self._plain_single_gpu(rate_cell, n)
            if cell.stage != "ddp" and plain is not None:
                entry["plain_pytorch_single_gpu_samples_per_s"] = plain
                if single > plain * (1 + SINGLE_GPU_TOLERANCE):
                    verdicts.append("needs-unstated-conditions")
                    text += f", {single / plain - 1:.0%} above plain PyTorch's implied {plain:.1f} on one GPU, " \
                            "where ZeRO partitions nothing"
            implied[rate_cell.row] = entry
            found.append(text)
        numbers["by_model"] = implied
        if not verdicts:
            return Verdict(cell, "needs-unstated-conditions", "no model of the throughput table has a single-GPU "
                           "run to scale from: " + "; ".join(found), numbers)
        return Verdict(cell, worst(verdicts), "the guide does not say which model; " + "; ".join(found), numbers)

    def _rates(self, stage: str, n: int) -> list[Cell]:
        return [c for c in self.guide.cells if c.table == "throughput" and c.kind == "rate" and c.stage == stage
                and c.world_size == n and c.number() is not None]

    def _plain_single_gpu(self, rate_cell: Cell, n: int) -> float | None:
        try:
            plain = self.guide.cell("throughput", rate_cell.row, "Standard PyTorch")
            efficiency = next(c for c in self.guide.cells if c.table == "scaling" and c.stage == "ddp"
                              and c.world_size == n)
        except (KeyError, StopIteration):
            return None
        rate, value = plain.number(), efficiency.number()
        return None if rate is None or not value else rate / (n * value / 100)

    def largest(self, cell: Cell) -> Verdict:
        model = cell.value.lower()
        shape = PRESETS.get(model)
        if shape is None:
            return Verdict(cell, "needs-unstated-conditions", f"{cell.value}: not a size of the guide's tables",
                           {})
        n = int(cell.world_size or self.gpus)
        states = zero_model_states(shape.params, "3", n)
        numbers = {"params": shape.params, "model_states_bytes": states, "vram_bytes": self.vram,
                   "largest_params_without_offload": int(self.vram / zero_model_states(1, "3", n))}
        if states > self.vram:
            return Verdict(cell, "needs-offload", f"ZeRO-3 on {n} GPUs keeps {_gb(states)} of model states per "
                           f"GPU for {cell.value}, more than the card's {_gb(self.vram)}: trainable only with "
                           "offload, which the table does not mention (without it the largest is about "
                           f"{numbers['largest_params_without_offload'] / 1e9:.1f}B parameters)", numbers)
        return Verdict(cell, "consistent", f"ZeRO-3 on {n} GPUs keeps {_gb(states)} per GPU for {cell.value}",
                       numbers)

    # --- cells computed from others -------------------------------------------------------------------------

    def computed(self, cell: Cell, judged: dict[tuple[str, str, str], Verdict]) -> Verdict:
        of = self.guide.cell(cell.table, cell.row, str(cell.of))
        over = self.guide.cell(cell.table, cell.row, str(cell.over))
        a, b = of.number(), over.number()
        numbers: dict[str, Any] = {"of": of.value, "over": over.value}
        if cell.is_infinite:
            ok = a is not None and over.is_oom
            shown = "∞ (the baseline ran out of memory)" if ok else f"not ∞: {of.value} over {over.value}"
        elif a is None or b is None or not b:
            ok, shown = False, f"{of.value} over {over.value} is not a number"
        else:
            computed = self._arithmetic(cell, a, b)
            numbers["computed"] = computed
            ok = abs(computed - float(cell.number() or 0)) <= 0.5 * 10 ** -cell.decimals() + 1e-9
            shown = f"{self._formula(cell, of, over)} = {computed:.4g}"
        if not ok:
            return Verdict(cell, "arithmetic-off", f"{cell.value} does not follow: {shown}", numbers)
        inputs = [judged[(c.table, c.row, c.column)] for c in (of, over)]
        verdict = worst(v.verdict for v in inputs)
        numbers["inputs"] = {v.cell.column: v.verdict for v in inputs}
        return Verdict(cell, verdict, f"{shown}, as printed; as good as the cells it is computed from ("
                       + ", ".join(f"{v.cell.column} {v.cell.value}: {v.verdict}" for v in inputs) + ")", numbers)

    @staticmethod
    def _arithmetic(cell: Cell, a: float, b: float) -> float:
        if cell.kind == "speedup" or cell.direction == "ratio":
            return a / b
        if cell.kind == "reduction" or cell.direction == "decrease":
            return (1 - a / b) * 100
        return (a / b - 1) * 100

    @staticmethod
    def _formula(cell: Cell, of: Cell, over: Cell) -> str:
        if cell.kind == "speedup" or cell.direction == "ratio":
            return f"{of.value} / {over.value}"
        if cell.kind == "reduction" or cell.direction == "decrease":
            return f"1 - {of.value} / {over.value}"
        return f"{of.value} / {over.value} - 1"


_MEASURED = {"memory": Judge.memory, "rate": Judge.rate, "efficiency": Judge.efficiency,
             "largest_model": Judge.largest}


def judge_guide(guide: Guide | None = None, peak: GpuPeak | None = None) -> list[Verdict]:
    """Every cell's verdict, in the guide's order: measured cells first judged, then the computed ones."""
    guide = guide or load_guide()
    judge = Judge(guide, peak or peak_named(str(guide.source["gpu"])), int(guide.source["gpus"]))
    judged: dict[tuple[str, str, str], Verdict] = {}
    for cell in guide.cells:
        if cell.kind in _MEASURED:
            judged[(cell.table, cell.row, cell.column)] = _MEASURED[cell.kind](judge, cell)
    for cell in guide.cells:
        if cell.kind not in _MEASURED:
            judged[(cell.table, cell.row, cell.column)] = judge.computed(cell, judged)
    return [judged[(c.table, c.row, c.column)] for c in guide.cells]


def shapes_document() -> dict[str, Any]:
    return {name: {"params": s.params, "layers": s.layers, "hidden": s.hidden, "heads": s.heads,
                   "vocab": s.vocab, "largest_layer_params": s.largest_layer_params} for name, s in PRESETS.items()}


def reference_document(guide: Guide | None = None) -> dict[str, Any]:
    """`bench --reference --json`: the guide's cells with their verdicts, the assumptions, the peak table."""
    guide = guide or load_guide()
    verdicts = judge_guide(guide)
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    return {
        "schema": SCHEMA, "source": guide.source, "tables": guide.tables,
        "assumptions": {"shapes": shapes_document(), "context_tokens": CONTEXT_TOKENS,
                        "gpu": peak_named(str(guide.source["gpu"])).to_json(),
                        "memory": "ZeRO paper: (2 + 2 + 12)Ψ bytes, stage 1 partitions the 12Ψ, 2 also the "
                                  "gradients' 2Ψ, 3 also the parameters' 2Ψ; GB = 10^9 bytes as printed",
                        "flops_per_sample": "6·N·T + 12·L·h·T², at 100% of the faster of FP16 and BF16 peak"},
        "verdicts": VERDICTS, "counts": counts,
        "cells": [v.to_json(guide.tables[v.cell.table]["unit"]) for v in verdicts],
        "config_values": config_values(guide), "peaks": [p.to_json() for p in load_peaks()],
    }


def config_values(guide: Guide) -> list[dict[str, Any]]:
    """The guide's AMD-specific settings beside DeepSpeed's defaults and what `config` writes."""
    ours = {"fp16.initial_scale_power": str(ROCM_FP16_INITIAL_SCALE_POWER),
            "zero_optimization.allgather_bucket_size": f"{ROCM_SMALL_GPU_BUCKET_SIZE:.0e}".replace("e+0", "e"),
            "zero_optimization.reduce_bucket_size": f"{ROCM_SMALL_GPU_BUCKET_SIZE:.0e}".replace("e+0", "e"),
            "zero_optimization.overlap_comm": "true",
            "amd_specific.rocm_mem_pool_init": "true (with patch 0014)",
            "amd_specific.rocm_stream_priority": "true (with patch 0014)"}
    rows = []
    for value in guide.config_values:
        says = value.get("guide_says", "")
        claimed_default = says.rpartition("(")[2].rstrip(")") if "(" in says else None
        rows.append({**value, "config_writes": ours.get(value["key"]),
                     "guide_default_is_right": None if claimed_default is None
                     else float(claimed_default) == float(value["deepspeed_default"])})
    return rows


def guide_departure(model: str, stage: int | None, offload_optimizer: bool, offload_param: bool) -> list[str]:
    """For `config --explain`: where the plan (None: refused) departs from the guide's memory table for this
    model, the guide's cell with its verdict. The guide's choice is its lowest ZeRO stage with a number."""
    guide = load_guide()
    verdicts = {v.cell.id: v for v in judge_guide(guide)}
    row = next((c.row for c in guide.cells if c.table == "memory" and c.model == model), None)
    if row is None:
        return []
    cell = next((c for c in (guide.cell("memory", row, f"DeepSpeed ZeRO-{s}") for s in (2, 3)) if not c.is_oom),
                None)
    if cell is None:
        return []
    if stage == int(str(cell.stage)) and not offload_optimizer and not offload_param:
        return []
    v = verdicts[cell.id]
    return [f"the guide puts {row} under ZeRO-{cell.stage} without offload at {cell.value} GB per GPU on "
            f"{guide.source['hardware']}: {VERDICTS[v.verdict]} ({v.reason})"]

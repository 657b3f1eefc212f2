"""The guide's tables as data, and the verdicts computed on them: the formulas on known numbers, every cell
of the guide's markdown present in guide.toml, the cells the issue names, and `bench --reference`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import run_cli

from mlstack_ds.bench import guide as guide_module
from mlstack_ds.bench.guide import load_guide
from mlstack_ds.bench.peaks import load_peaks, peak_named
from mlstack_ds.bench.physics import (
    deepspeed_estimate,
    flops_per_sample,
    longest_sequence,
    zero_model_states,
)
from mlstack_ds.bench.verdicts import VERDICTS, guide_departure, judge_guide, reference_document
from mlstack_ds.config.model import PRESETS

GUIDE_MD = Path(__file__).parents[1] / "fixtures" / "guide" / "guide-benchmarks.md"
TABLES = {"Training throughput (samples/second)": "throughput", "Memory usage (GB)": "memory",
          "Scaling efficiency": "scaling", "v0.1.1 vs v0.1.2 (the guide's own tool versions)": "versions"}
ROW_CONDITIONS = {"Batch Size": "batch_size"}  # columns that state a row's conditions, not a claim
GIB24 = 24 * 2**30


def markdown_cells() -> list[tuple[str, str, str, str]]:
    """(table, row, column, value) of every cell of the guide's tables, row header and conditions excluded."""
    found: list[tuple[str, str, str, str]] = []
    table = None
    header: list[str] = []
    for line in GUIDE_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            table, header = TABLES.get(line[3:].strip()), []
            continue
        if table is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"-*", "".join(cells)):
            continue
        if not header:
            header = cells
            continue
        found += [(table, cells[0], column, value) for column, value in zip(header[1:], cells[1:], strict=True)]
    return found


def by_id() -> dict[str, dict]:
    return {c["id"]: c for c in reference_document()["cells"]}


# --- the formulas ------------------------------------------------------------------------------------------------

def test_zero_model_states_are_the_papers_per_stage_formulas() -> None:
    psi = 13_000_000_000
    assert zero_model_states(psi, "ddp", 2) == zero_model_states(psi, "0", 2) == 16 * psi
    assert zero_model_states(psi, "1", 2) == 4 * psi + 6 * psi  # 2Ψ + 2Ψ + 12Ψ/2
    assert zero_model_states(psi, "2", 2) == 2 * psi + 7 * psi  # 2Ψ + 14Ψ/2
    assert zero_model_states(psi, "3", 2) == 104_000_000_000  # the issue's ~104 GB per GPU
    assert zero_model_states(psi, "3", 64) == psi // 4
    with pytest.raises(ValueError):
        zero_model_states(psi, "4", 2)


def test_deepspeed_estimate_matches_what_its_estimator_printed_for_config() -> None:
    """docs/config.md: DeepSpeed 0.19.5's estimator gave 108.7 GiB for the 13b preset, ZeRO-3 on 2 GPUs."""
    estimate = deepspeed_estimate(PRESETS["13b"], "3", 2)
    assert estimate is not None and round(estimate / 2**30, 1) == 108.7
    assert deepspeed_estimate(PRESETS["13b"], "1", 2) is None
    assert deepspeed_estimate(PRESETS["13b"], "2", 2, offload_optimizer=True) == 2 * PRESETS["13b"].params


def test_the_longest_sequence_is_the_last_one_within_the_peak() -> None:
    shape, peak = PRESETS["13b"], 2 * 122.8e12
    longest = longest_sequence(5.7, shape, peak)
    assert flops_per_sample(shape, longest) * 5.7 <= peak < flops_per_sample(shape, longest + 1) * 5.7
    assert 500 < longest < 600  # 6·N·T alone: 245.6e12 / (5.7 × 6 × 12.84e9) = 559
    assert longest / 2 <= longest_sequence(5.7, shape, peak / 2) < longest  # T² grows faster than the budget
    assert longest_sequence(1e9, shape, peak) == 0


def test_every_gpu_the_issue_names_has_a_sourced_dense_peak() -> None:
    names = {p.name for p in load_peaks()}
    for wanted in ("RX 7900 XTX", "MI210", "MI250X", "MI300X", "MI325X", "MI355X", "RX 9070 XT", "Strix Halo"):
        assert any(wanted in name for name in names), wanted
    for peak in load_peaks():
        assert peak.fp16_tflops > 0 and peak.bf16_tflops > 0 and peak.source.startswith("AMD, ") and peak.basis
        assert "sparsity" not in peak.source or "not used" in peak.source or "INT4 with sparsity" in peak.source
    assert peak_named("MI250X").per_device_flops == pytest.approx(191.5e12)  # two GCDs, two ROCm devices
    assert peak_named("7900 XTX").vram_bytes == GIB24


# --- the data --------------------------------------------------------------------------------------------------

def test_every_cell_of_the_guides_markdown_is_in_the_data_as_printed() -> None:
    guide = load_guide()
    cells = markdown_cells()
    assert len(cells) >= 60
    stored = {(c.table, c.row, c.column): c for c in guide.cells}
    claims = [c for c in cells if c[2] not in ROW_CONDITIONS]
    missing = [c for c in claims if stored.get(c[:3]) is None or stored[c[:3]].value != c[3]]
    assert not missing, f"guide.toml lacks or changed these cells: {missing}"
    assert len(stored) == len(claims), "guide.toml holds cells the guide does not have"
    for table, row, column, value in cells:
        if column in ROW_CONDITIONS:  # the batch size is a condition of every cell of its row
            row_cells = [c for c in guide.cells if c.table == table and c.row == row]
            assert row_cells and all(getattr(c, ROW_CONDITIONS[column]) == value for c in row_cells)


def test_no_verdict_is_stored_in_the_data() -> None:
    text = (Path(guide_module.__file__).parent / "guide.toml").read_text(encoding="utf-8")
    assert not re.search(r"^\s*verdict\s*=", text, re.MULTILINE)
    assert not any(word in text for word in ("\"impossible\"", "\"consistent\""))


# --- the verdicts the issue names ------------------------------------------------------------------------------

def test_13b_zero3_memory_is_impossible_with_the_bytes_it_would_need() -> None:
    cell = by_id()["memory/13B/DeepSpeed ZeRO-3"]
    assert cell["value"] == "24.8" and cell["verdict"] == "impossible"
    states = cell["numbers"]["model_states_bytes"]
    assert 100e9 < states < 106e9 and states > cell["numbers"]["vram_bytes"] == GIB24
    assert cell["numbers"]["deepspeed_estimate_bytes"] > states
    assert "102.8 GB of model states per GPU" in cell["reason"]


def test_13b_zero3_throughput_names_the_longest_possible_sequence() -> None:
    cell = by_id()["throughput/13B/DeepSpeed ZeRO-3"]
    longest = cell["numbers"]["longest_seq_len"]
    assert cell["value"] == "5.7" and cell["verdict"] == "impossible"  # the run itself cannot fit either
    assert longest == longest_sequence(5.7, PRESETS["13b"], 2 * peak_named("7900 XTX").per_device_flops)
    assert f"up to T = {longest} tokens" in cell["reason"]


def test_350m_cells_are_judged_with_their_numbers() -> None:
    cells = by_id()
    memory = cells["memory/350M/DeepSpeed ZeRO-2"]
    assert memory["verdict"] == "consistent"
    assert memory["numbers"]["model_states_bytes"] == zero_model_states(PRESETS["350m"].params, "2", 2)
    assert memory["numbers"]["model_states_bytes"] < memory["numbers"]["claimed_bytes"] == 5.7e9
    rate = cells["throughput/350M/DeepSpeed ZeRO-2"]
    assert rate["verdict"] == "short-sequences-only" and 0 < rate["numbers"]["longest_seq_len"] < 2048
    assert rate["numbers"]["percent_of_peak_at_context"] > 100
    assert cells["throughput/350M/Speedup (ZeRO-2)"]["numbers"]["computed"] == pytest.approx(168.7 / 142.3)


def test_computed_cells_are_checked_and_inherit_their_inputs() -> None:
    cells = by_id()
    assert cells["throughput/13B/Speedup (ZeRO-2)"]["verdict"] == "arithmetic-off"  # ∞ over OOM and OOM
    assert cells["memory/6.7B/Memory Reduction (ZeRO-3)"]["verdict"] == "impossible"  # ∞ over OOM, input impossible
    assert cells["memory/1.3B/Memory Reduction (ZeRO-3)"]["verdict"] == "needs-offload"
    assert cells["versions/Training Throughput (1B)/Improvement"]["numbers"]["computed"] == pytest.approx(24.47, 0.01)


def test_scaling_beyond_the_stated_gpus_and_zero_above_plain_pytorch_on_one_gpu_are_flagged() -> None:
    cells = by_id()
    assert cells["scaling/1/DeepSpeed ZeRO-2"]["verdict"] == "consistent"
    assert cells["scaling/8/DeepSpeed ZeRO-3"]["verdict"] == "not-on-stated-hardware"
    two = cells["scaling/2/DeepSpeed ZeRO-2"]
    assert two["verdict"] == "needs-unstated-conditions"
    single = two["numbers"]["by_model"]["350M"]
    assert single["implied_single_gpu_samples_per_s"] == pytest.approx(168.7 / (2 * 0.98))
    assert single["implied_single_gpu_samples_per_s"] > single["plain_pytorch_single_gpu_samples_per_s"]
    assert two["numbers"]["by_model"]["6.7B"]["single_gpu_fits"] is False


def test_every_cell_has_a_known_verdict_and_the_document_counts_them() -> None:
    document = reference_document()
    assert {c["verdict"] for c in document["cells"]} <= set(VERDICTS)
    assert sum(document["counts"].values()) == len(document["cells"]) == len(judge_guide())


def test_config_explain_cites_the_guides_cell_where_the_plan_departs() -> None:
    assert guide_departure("350m", 2, False, False) == []  # the same choice as the guide's
    (line,) = guide_departure("13b", None, False, False)  # config refuses 13B on 2 × 24 GiB
    assert "ZeRO-3 without offload at 24.8 GB" in line and "impossible" in line
    (line,) = guide_departure("6.7b", 3, True, False)
    assert "ZeRO-2 without offload at 28.3 GB" in line
    assert guide_departure("tiny", 2, False, False) == []


# --- the command -----------------------------------------------------------------------------------------------

def test_bench_reference_json_lists_every_cell_with_a_verdict() -> None:
    result = run_cli("bench", "--reference", "--json")
    assert result.returncode == 0, result.stderr
    cells = result.json["cells"]
    main = [c for c in cells if c["table"] in ("throughput", "memory", "scaling")]
    assert len(main) >= 40 and all(c["verdict"] in VERDICTS and c["reason"] for c in cells)
    assert {c["id"] for c in cells} == {f"{t}/{r}/{col}" for t, r, col, _v in markdown_cells()
                                          if col not in ROW_CONDITIONS}
    assert result.json["schema"] == 1 and len(result.json["peaks"]) >= 8


def test_bench_reference_table_and_its_refusals() -> None:
    result = run_cli("bench", "--reference", columns=300)
    assert result.returncode == 0, result.stderr
    assert "memory/13B/DeepSpeed ZeRO-3 = 24.8: impossible" in result.stdout
    assert "Peak dense FP16/BF16" in result.stdout
    refused = run_cli("bench", "--reference", "--world-size", "2", "--plot", "x.png")
    assert refused.returncode == 2
    error, hint = refused.one_error()
    assert "--world-size, --plot" in error and "drop" in hint

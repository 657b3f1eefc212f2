"""`mlstack-ds bench` for real on the installed target: 2 CPU ranks, DeepSpeed 0.19.5 with its prebuilt ops.

Kept short (few steps, two stages) for CI; the full default run is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import CliResult, run_cli

# Only reads the installed target: runs beside the tests that change it (tests/conftest.py: target_access).
pytestmark = [pytest.mark.slow, pytest.mark.reads_target]

# Buckets sized for the tiny model (2e6 elements; DeepSpeed's default reduce bucket of 5e8 elements is a
# 2 GB fp32 buffer on every ZeRO-3 rank, which would dwarf the 17M-parameter model's states).
SMALL_BUCKETS = {"zero_optimization": {"reduce_bucket_size": 2_000_000, "allgather_bucket_size": 2_000_000,
                                       "stage3_prefetch_bucket_size": 2_000_000,
                                       "stage3_max_live_parameters": 2_000_000, "stage3_max_reuse_distance": 2_000_000}}

# The --json document (schema 1, docs/benchmarks.md "bench"): exactly these keys, so a change is deliberate.
REPORT_KEYS = {"schema", "python", "machine", "spec", "runs", "scaling", "scaling_reference", "comparison", "ok"}
RUN_KEYS = {"world_size", "stage", "status", "reason", "samples_per_s", "tokens_per_s", "model_tflops_per_s",
            "peak_memory_bytes", "peak_memory_kind", "live_tensor_bytes", "precision", "params", "flops_per_sample",
            "step_times_s", "duration_s", "hosts"}


def bench(python: Path | str, *args: str, timeout: float = 600) -> CliResult:
    return run_cli("bench", "--python", python, *args, timeout=timeout, columns=200)


def runs_by_stage(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["stage"]: run for run in report["runs"]}


def test_zero0_and_zero3_measured_with_sane_numbers_json_and_plot(target_venv, tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(SMALL_BUCKETS))
    plot = tmp_path / "bench.png"
    result = bench(target_venv.python, "--stages", "0,3", "--steps", "3", "--warmup", "1", "--config", str(config),
                   "--plot", str(plot), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report) == REPORT_KEYS and set(report["machine"]) == {"platform", "arch", "vram_gib"}
    assert all(set(run) == RUN_KEYS for run in report["runs"])
    assert report["schema"] == 1 and report["ok"] is True
    assert report["spec"]["model"]["name"] == "tiny" and report["spec"]["stages"] == ["0", "3"]
    runs = runs_by_stage(report)
    for run in runs.values():
        assert run["status"] == "ok" and run["world_size"] == 2 and run["precision"] == "fp32", run
        rate = run["samples_per_s"]
        assert 0 < rate["min"] <= rate["median"] <= rate["max"]
        assert len(run["step_times_s"]) == 3
        assert run["tokens_per_s"] == pytest.approx(rate["median"] * report["spec"]["seq_len"])
        assert run["peak_memory_kind"] == "rss" and len(run["peak_memory_bytes"]) == 2
        assert all(p > 100 * 2**20 for p in run["peak_memory_bytes"])  # torch alone is more than that
        assert run["model_tflops_per_s"] == pytest.approx(rate["median"] * run["flops_per_sample"] / 1e12)
        assert run["params"] == runs["0"]["params"] > 10_000_000
    # ZeRO-3 partitions parameters, gradients and optimizer states over the 2 ranks: each holds less.
    assert max(runs["3"]["live_tensor_bytes"]) < min(runs["0"]["live_tensor_bytes"])
    # Progress while it ran: the stage, its steps and the elapsed time.
    assert "[2/2] ZeRO-3 on 2 rank(s)" in result.stderr and "ZeRO-3: step 4/4 (timed)" in result.stderr
    (comparison,) = report["comparison"]
    assert comparison["comparable"] is False
    assert any("this run is on CPU" in why for why in comparison["differences"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_out_of_memory_is_a_result_not_a_crash(target_venv) -> None:
    result = bench(target_venv.python, "--stages", "0", "--steps", "1", "--warmup", "0", "--memory-cap", "16MiB")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OOM" in result.stdout
    assert "ran out of memory at model" in result.stdout and "Traceback" not in result.stderr


def test_a_jit_compile_fails_the_stage(no_ops_venv) -> None:
    """DeepSpeed without prebuilt ops: the first op it loads would be compiled; bench refuses."""
    result = bench(no_ops_venv.python, "--stages", "0", "--steps", "1", "--warmup", "0", "--json")
    assert result.returncode == 10, result.stderr[-3000:]
    report = json.loads(result.stdout)
    (run,) = report["runs"]
    assert run["status"] == "failed" and "needs a JIT compile" in run["reason"], run
    assert report["error"]["exit_code"] == 10

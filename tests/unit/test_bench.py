"""bench's pure parts: stage parsing, the verdict of a launch, statistics and scaling, the reference."""

from __future__ import annotations

import pytest

from mlstack_ds.bench.guide import load_guide
from mlstack_ds.bench.reference import Machine, compare
from mlstack_ds.bench.report import build_report, render, scaling, stage_numbers
from mlstack_ds.bench.run import StageRun, judge
from mlstack_ds.bench.spec import TINY, BenchSpec, parse_stages, parse_world_sizes
from mlstack_ds.bench.verdicts import judge_guide
from mlstack_ds.errors import UsageError
from mlstack_ds.launch.launcher import LaunchOutcome

SPEC = BenchSpec(model=TINY, stages=("ddp", "3"), world_sizes=(1, 2), steps=3, warmup=1, micro_batch=2, seq_len=64)
FINISHED = LaunchOutcome(0, 10.0, False, "")


def ok_rank(times: list[float], samples: int = 4) -> dict:
    return {"status": "ok", "step_times_s": times, "samples_per_step": samples, "flops_per_sample": 10**12,
            "peak_rss_bytes": 2**30, "live_tensor_bytes": 2**28, "precision": "fp32", "params": 17_000_000}


def test_stages_are_normalised_in_order_once() -> None:
    assert parse_stages("DDP,zero2,z3,2,0") == ("ddp", "2", "3", "0")
    assert parse_world_sizes("4,1,2,2") == (1, 2, 4)
    with pytest.raises(UsageError, match="5 is not a stage"):
        parse_stages("ddp,5")


def test_a_launch_is_ok_oom_or_failed() -> None:
    assert judge({0: ok_rank([1.0]), 1: ok_rank([1.0])}, 2, FINISHED, 60) == ("ok", "")
    oom = {0: {"status": "oom", "phase": "step 1", "reason": "RuntimeError: can't allocate memory"}}
    verdict, reason = judge(oom, 2, LaunchOutcome(1, 3.0, False, ""), 60)  # rank 1 was stopped: wrote nothing
    assert verdict == "oom" and reason.startswith("rank 0 ran out of memory at step 1")
    jit = {0: ok_rank([1.0]), 1: {"status": "jit", "phase": "initialize", "reason": "op 'fused_adam' ..."}}
    assert judge(jit, 2, FINISHED, 60)[1].startswith("rank 1 needs a JIT compile (prebuilt ops only) at initialize")
    assert judge({0: ok_rank([1.0])}, 2, LaunchOutcome(None, 60.0, True, ""), 60) == ("failed", "timed out after 60 s")
    limit = "the job reached its time limit (salloc/sbatch --time): Slurm cancelled the ranks"
    assert judge({0: ok_rank([1.0])}, 2, LaunchOutcome(143, 60.0, False, "task 1: Terminated", {1: -15}, limit),
                 60) == ("failed", limit)
    verdict, reason = judge({0: ok_rank([1.0])}, 2, LaunchOutcome(1, 5.0, False, "boom"), 60)
    assert verdict == "failed" and "rank(s) 1 reported nothing (launcher exit code 1): boom" in reason


def test_throughput_is_the_median_step_with_its_spread_and_scaling_per_rank() -> None:
    one = stage_numbers(StageRun(1, "3", "ok", "", {0: ok_rank([1.0, 2.0, 4.0], samples=2)}, 9.0), SPEC)
    assert one.samples_per_s == {"median": 1.0, "min": 0.5, "max": 2.0}
    assert one.tokens_per_s == 64.0 and one.model_tflops_per_s == 1.0
    two = stage_numbers(StageRun(2, "3", "ok", "", {0: ok_rank([1.0] * 3), 1: ok_rank([1.0] * 3)}, 9.0), SPEC)
    assert two.samples_per_s["median"] == 4.0 and two.peak_memory_bytes == [2**30, 2**30]
    (base, scaled) = scaling([one, two])
    assert base["efficiency"] == 1.0 and scaled["efficiency"] == 2.0  # 4 samples/s on 2 ranks vs 1 on 1
    oom = stage_numbers(StageRun(2, "ddp", "oom", "rank 0 ran out of memory", {0: {"status": "oom"}}, 2.0), SPEC)
    assert oom.samples_per_s is None and scaling([oom]) == []


def test_the_guides_cells_stand_beside_a_run_only_on_its_own_hardware_and_model() -> None:
    guide, verdicts = load_guide(), judge_guide()
    assert guide.source["hardware"] == "2x AMD Radeon RX 7900 XTX"
    measured = {"3": {"peak_memory_gb_per_gpu": 23.0}}
    same = compare(guide, verdicts, Machine("gpu", "gfx1100", 24.0), "13b", world_size=2, measured=measured)
    memory = next(r for r in same["rows"] if r["id"] == "memory/13B/DeepSpeed ZeRO-3")
    assert same["comparable"] is True and memory["reference"] == "24.8" and memory["measured"] == 23.0
    assert memory["verdict"] == "impossible" and "102.8 GB of model states" in memory["reason"]
    assert {r["id"] for r in same["rows"]} == {f"{t}/13B/{c}" for t in ("throughput", "memory")
                                             for c in ("Standard PyTorch", "DeepSpeed ZeRO-2", "DeepSpeed ZeRO-3")}
    cpu = compare(guide, verdicts, Machine("cpu", None, None), "tiny", world_size=2, measured=measured)
    assert cpu["comparable"] is False and cpu["rows"] == []
    assert cpu["differences"][0].startswith("this run is on CPU")
    other_card = compare(guide, verdicts, Machine("gpu", "gfx90a", 64.0), "13b", world_size=2, measured=measured)
    assert other_card["differences"] == ["GPU target gfx90a, the guide's is gfx1100"]
    assert all(r["measured"] is None and r["verdict"] for r in other_card["rows"])  # no ratio across hardware


def gpu_rank(times: list[float], samples: int, peak: int) -> dict:
    return {**ok_rank(times, samples), "peak_accelerator_bytes": peak, "precision": "bf16"}


def test_a_saved_350m_run_on_the_guides_hardware_shows_the_guides_cells_and_verdicts(tmp_path) -> None:
    """A real run's result (as run.py returns it), reported: the guide's cell beside each measured one."""
    from rich.console import Console

    from mlstack_ds.bench.spec import MODELS

    spec = BenchSpec(model=MODELS["350m"], stages=("ddp", "2"), world_sizes=(1, 2), steps=3, warmup=1,
                     micro_batch=16, seq_len=512)
    runs = [StageRun(size, stage, "ok", "", {rank: gpu_rank([1.0] * 3, 16 * size, 6 * 10**9) for rank in range(size)},
                     9.0) for size in (1, 2) for stage in ("ddp", "2")]  # 16 samples per rank and step
    report = build_report(spec, runs, "python", Machine("gpu", "gfx1100", 24.0))
    two = next(c for c in report["comparison"] if c["world_size"] == 2)
    assert two["comparable"] is True
    zero2 = next(r for r in two["rows"] if r["id"] == "throughput/350M/DeepSpeed ZeRO-2")
    assert zero2["measured"] == 32.0 and zero2["reference"] == "168.7" and zero2["verdict"] == "short-sequences-only"
    (scaled,) = [r for r in report["scaling_reference"] if r["stage"] == "2"]
    assert scaled["reference"] == "98%" and scaled["implied_samples_per_s"] == pytest.approx(16 * 2 * 0.98)
    out = tmp_path / "report.txt"
    with out.open("w") as stream:
        render(report, Console(file=stream, width=400, force_terminal=False))
    text = out.read_text()
    assert "guide samples/s" in text and "168.7 (short-sequences-only)" in text
    assert "5.7 (consistent)" in text  # ZeRO-2 memory, 5.7 GB, beside the measured 6.00 GB
    assert "the guide's 98% would be 31.36 samples/s from this baseline, 32.00 measured" in text

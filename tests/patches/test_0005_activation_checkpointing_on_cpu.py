"""Patch 0005 (upstream PR #8611): activation checkpointing creates no stream, so it runs on the CPU accelerator.

probes/activation_checkpointing_probe.py runs DeepSpeed's real `checkpoint` and `non_reentrant_checkpoint`
(forward and backward of a small module with dropout) and compares the gradients with a plain run. 0.19.5
creates an unused `get_accelerator().Stream(...)` in each; the CPU accelerator's Stream is None, so both raise
`TypeError: 'NoneType' object is not callable` on the first forward. probes/pipeline_checkpointing_probe.py
trains a 2-stage PipelineModule (2 ranks, gloo, torchrun) with `activation_checkpoint_interval` 0 and 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

from mlstack_ds.launch.launcher import free_port

PROBES = Path(__file__).resolve().parent / "probes"
PROBE = PROBES / "activation_checkpointing_probe.py"
CHECKPOINTING = "deepspeed/runtime/activation_checkpointing/checkpointing.py"
# where 0.19.5 creates the stream on the first forward of each function
PRISTINE_LINE = {"checkpoint": 526, "non_reentrant_checkpoint": 748}


@pytest.fixture(scope="module")
def results(ds_tree: tuple[str, Path]) -> tuple[str, dict[str, dict]]:
    kind, tree = ds_tree
    result = run_python_in_tree(tree, PROBE, *PRISTINE_LINE)
    assert result.ok, result.tail(40)
    assert "ACCELERATOR cpu" in result.stdout.splitlines()
    found = [json.loads(ln.removeprefix("RESULT ")) for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    return kind, {r["function"]: r for r in found}


@pytest.mark.parametrize("function", list(PRISTINE_LINE))
def test_checkpointed_gradients_match_a_plain_run(results, function):
    kind, by_function = results
    result = by_function[function]
    if kind == "pristine":  # the bug: the unused stream is created from the CPU accelerator's None
        assert result == {
            "function": function,
            "error": "TypeError: 'NoneType' object is not callable",
            "frame": {"where": f"{CHECKPOINTING}:{PRISTINE_LINE[function]}",
                      "code": "transport_stream = get_accelerator().Stream(device=cuda_device)"},
        }
    else:
        assert "error" not in result, result
        assert result["gradients"] == 5  # two weights, two biases, the input
        assert result["nonzero"]
        assert result["max_abs_diff"] <= 1e-6


@pytest.mark.slow
def test_pipeline_with_checkpointing_trains_like_without(ds_tree: tuple[str, Path], tmp_path: Path):
    """2 ranks x 2 runs (interval 0, then 1) of deepspeed.initialize + 3 pipeline batches, per tree."""
    kind, tree = ds_tree
    result = run_python_in_tree(tree, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--master_port", str(free_port()), PROBES / "pipeline_checkpointing_probe.py",
                                tmp_path, timeout=900)
    ranks = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    if kind == "pristine":  # stage 0 checkpoints its first Linear and dies in the stream creation
        assert not result.ok
        assert {"error": "TypeError: 'NoneType' object is not callable",
                "where": "runtime/activation_checkpointing/checkpointing.py:526"} in [r.get("1") for r in ranks]
        return
    assert result.ok, result.tail(40)
    assert len(ranks) == 2
    for rank in ranks:
        plain, checkpointed = rank["0"], rank["1"]
        assert len(plain) == 3 and checkpointed == pytest.approx(plain, abs=1e-6)
    assert ranks[0] == ranks[1]  # the pipeline engine gives every stage the last stage's loss

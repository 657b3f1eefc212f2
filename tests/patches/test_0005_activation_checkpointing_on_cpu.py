"""Patch 0005 (upstream PR #8611): activation checkpointing creates no stream, so it runs on the CPU accelerator.

probes/activation_checkpointing_probe.py runs DeepSpeed's real `checkpoint` and `non_reentrant_checkpoint`
(forward and backward of a small module with dropout) and compares the gradients with a plain run. 0.19.5
creates an unused `get_accelerator().Stream(...)` in each; the CPU accelerator's Stream is None, so both raise
`TypeError: 'NoneType' object is not callable` on the first forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ds_patch_helpers import run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "activation_checkpointing_probe.py"
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

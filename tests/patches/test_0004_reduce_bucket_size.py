"""Patch 0004 (upstream PR #8266): `zero_optimization.reduce_bucket_size` must be greater than 0.

DeepSpeed's real DeepSpeedZeroConfig (pydantic) parses each value in a subprocess importing DeepSpeed from
the tree. 0.19.5 accepts 0, which ZeRO then divides by in the first backward (`ZeroDivisionError: float
floor division by zero` in base_optimizer.report_ipg_memory_usage, reproduced on the CPU accelerator).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

VALUES = [1, 0, -1, 500_000_000]
PROBE = """
import json, sys
from pydantic import ValidationError
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
results = {}
for value in json.loads(sys.argv[1]):
    try:
        results[value] = DeepSpeedZeroConfig(stage=2, reduce_bucket_size=value).reduce_bucket_size
    except ValidationError as exc:
        error = exc.errors()[0]
        results[value] = {"loc": list(error["loc"]), "msg": error["msg"]}
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def parsed(ds_tree: tuple[str, Path]) -> tuple[str, dict[str, int | dict]]:
    kind, tree = ds_tree
    result = run_python_in_tree(tree, "-c", PROBE, json.dumps(VALUES))
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    return kind, json.loads(line.removeprefix("RESULTS "))


def test_zero_is_refused_when_the_config_is_parsed(parsed):
    kind, results = parsed
    if kind == "pristine":  # the bug: accepted here, ZeroDivisionError in the first backward
        assert results["0"] == 0
    else:
        assert results["0"] == {"loc": ["reduce_bucket_size"], "msg": "Input should be greater than 0"}


def test_negative_is_refused_on_both_trees(parsed):
    kind, results = parsed
    expected = "Input should be greater than or equal to 0" if kind == "pristine" else "Input should be greater than 0"
    assert results["-1"] == {"loc": ["reduce_bucket_size"], "msg": expected}


@pytest.mark.parametrize("value", [1, 500_000_000])
def test_positive_values_are_kept(parsed, value):
    _, results = parsed
    assert results[str(value)] == value

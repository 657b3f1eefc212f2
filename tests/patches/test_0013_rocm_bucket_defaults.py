"""Patch 0013: ZeRO bucket sizes default to 1e8 on ROCm GPUs under 64 GiB, unless the user set them.

DeepSpeed's real DeepSpeedZeroConfig is built in a subprocess that fakes only the hardware: a ROCm
torch (torch.version.hip) with one visible GPU of a given memory size (see probes/zero_bucket_probe.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "zero_bucket_probe.py"
OLD, SMALL = 500_000_000, 100_000_000
RX_7900_XTX_GIB = 24
MI300X_GIB = 192

# name -> (GPU memory in GiB or None for no ROCm GPU, zero_optimization section)
CASES = {
    "radeon-defaults-zero2": (RX_7900_XTX_GIB, {"stage": 2}),
    "radeon-defaults-zero3": (RX_7900_XTX_GIB, {"stage": 3}),
    "radeon-explicit-reduce": (RX_7900_XTX_GIB, {"stage": 2, "reduce_bucket_size": 300_000_000}),
    "radeon-explicit-old-default": (RX_7900_XTX_GIB, {"stage": 2, "reduce_bucket_size": OLD,
                                                      "allgather_bucket_size": OLD}),
    "just-under-64-gib": (63.9, {"stage": 2}),
    "exactly-64-gib": (64, {"stage": 2}),
    "mi300x": (MI300X_GIB, {"stage": 3}),
    "rocm-torch-without-visible-gpu": (None, {"stage": 2}),
}
LOG_LINE = "ZeRO reduce_bucket_size and allgather_bucket_size default to 1e8 instead of 5e8"


@pytest.fixture(scope="module")
def probe_run(ds_tree: tuple[str, Path]) -> tuple[str, dict[str, list[int]], str]:
    kind, tree = ds_tree
    cases = [{"gpu_gib": gib, "zero": zero} for gib, zero in CASES.values()]
    result = run_python_in_tree(tree, PROBE, json.dumps(cases), env={"DS_ACCELERATOR": "cuda"})
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    sizes = dict(zip(CASES, json.loads(line.removeprefix("RESULTS ")), strict=True))
    return kind, sizes, result.stdout + result.stderr


@pytest.mark.parametrize("case", ["radeon-defaults-zero2", "radeon-defaults-zero3", "just-under-64-gib"])
def test_small_rocm_gpu_gets_smaller_default_buckets(probe_run, case):
    kind, sizes, _ = probe_run
    assert sizes[case] == ([OLD, OLD] if kind == "pristine" else [SMALL, SMALL])


def test_explicit_value_is_kept_and_only_the_unset_one_defaults(probe_run):
    kind, sizes, _ = probe_run
    assert sizes["radeon-explicit-reduce"] == [300_000_000, OLD if kind == "pristine" else SMALL]


@pytest.mark.parametrize("case", ["radeon-explicit-old-default", "exactly-64-gib", "mi300x",
                                  "rocm-torch-without-visible-gpu"])
def test_unchanged_where_the_rule_does_not_apply(probe_run, case):
    _, sizes, _ = probe_run
    assert sizes[case] == [OLD, OLD]


def test_chosen_default_is_logged_once(probe_run):
    kind, _, output = probe_run
    assert output.count(LOG_LINE) == (0 if kind == "pristine" else 1)


def test_non_rocm_platform_is_unchanged(ds_tree):
    """CPU torch (torch.version.hip is None) on DeepSpeed's CPU accelerator: upstream defaults stay."""
    _, tree = ds_tree
    code = ("from deepspeed.runtime.zero.config import DeepSpeedZeroConfig\n"
            "z = DeepSpeedZeroConfig(stage=2)\n"
            "print('SIZES', z.reduce_bucket_size, z.allgather_bucket_size)\n")
    result = run_python_in_tree(tree, "-c", code)
    assert result.ok, result.tail()
    assert f"SIZES {OLD} {OLD}" in result.stdout

"""Patch 0016: ops that cannot be built on ROCm say so through is_compatible(), so DS_BUILD_OPS=1 skips them.

probes/op_compatibility_probe.py fakes a ROCm torch and runs each builder's real is_compatible(verbose=True).
setup.py skips an op whose is_compatible() is False ("Skip pre-compile of incompatible <op>"); 0.19.5
reports these four compatible and then fails building them (dskernels missing, NVIDIA PTX, CUTLASS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "op_compatibility_probe.py"
REASONS = {
    "cutlass_ops": "cutlass_ops is not compatible with ROCm: it links libdeepspeedft from deepspeed-kernels",
    "ragged_device_ops": "ragged_device_ops is not compatible with ROCm: it links libblockedflash from "
                         "deepspeed-kernels",
    "inference_core_ops": "inference_core_ops is not compatible with ROCm: its cuda_linear FP6 GEMM is NVIDIA PTX",
    "evoformer_attn+cutlass": "evoformer_attn is not compatible with ROCm: its kernels are built on NVIDIA CUTLASS",
}


@pytest.fixture(scope="module")
def compatibility(ds_tree: tuple[str, Path]) -> tuple[str, dict]:
    kind, tree = ds_tree
    result = run_python_in_tree(tree, PROBE)
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    return kind, json.loads(line.removeprefix("RESULTS "))


@pytest.mark.parametrize("op", sorted(REASONS))
def test_cuda_only_op_is_incompatible_on_rocm_with_a_reason(compatibility, op):
    kind, results = compatibility
    if kind == "pristine":  # the bug: reported buildable, so DS_BUILD_OPS=1 tries it and the build fails
        assert (results[op]["compatible"], results[op]["warnings"]) == (True, "")
    else:
        assert results[op]["compatible"] is False
        assert REASONS[op] in results[op]["warnings"]


@pytest.mark.parametrize("op", ["cutlass_ops", "ragged_device_ops"])
def test_dskernels_ops_cannot_link_without_the_cuda_only_package(compatibility, op):
    """Why 0.19.5's "compatible" is wrong for these two: their link flags need the dskernels package."""
    _, results = compatibility
    assert results[op]["extra_ldflags"] == "ModuleNotFoundError: No module named 'dskernels'"


def test_evoformer_without_cutlass_is_incompatible(compatibility):
    """0.19.5 already says no when it finds no CUTLASS (it searches the venv, /usr, /usr/local, ...)."""
    kind, results = compatibility
    if kind == "pristine" and "Unable to locate CUTLASS" not in results["evoformer_attn"]["warnings"]:
        pytest.skip("this machine has a CUTLASS tree that evoformer_attn finds")
    assert results["evoformer_attn"]["compatible"] is False


@pytest.mark.parametrize("op", ["fused_adam", "fused_lamb", "quantizer", "ragged_ops"])
def test_rocm_capable_ops_stay_compatible(compatibility, op):
    _, results = compatibility
    assert results[op] == {"compatible": True, "warnings": ""}

"""Patch 0015: hipcc compiles DeepSpeed's ROCm ops with the C++ standard torch uses (C++20 from torch 2.12).

probes/cpp_standard_probe.py fakes a ROCm torch of each version and prints the -std flags of DeepSpeed's
real cxx_args()/nvcc_args(), and the -std hipcc finally gets from the installed torch's JIT ninja writer.
0.19.5 gives hipcc -std=c++17 whatever the torch; torch 2.14's headers stop with `#error C++20 or later
compatible compiler is required to use PyTorch.` under it (docs/patches.md has the per-version evidence).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "cpp_standard_probe.py"
OLD_TORCH, TORCH_2_12, TORCH_2_13, TORCH_2_14 = "2.11.0+rocm6.4", "2.12.0+rocm7.0", "2.13.0+rocm7.2", "2.14.0+rocm7.2"
BASE_NVCC_ARGS_OPS = ["quantizer", "transformer", "transformer_inference"]


@pytest.fixture(scope="module")
def flags(ds_tree: tuple[str, Path]) -> tuple[str, dict]:
    kind, tree = ds_tree
    versions = [OLD_TORCH, TORCH_2_12, TORCH_2_13, TORCH_2_14]
    result = run_python_in_tree(tree, PROBE, json.dumps(versions))
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    return kind, json.loads(line.removeprefix("RESULTS "))


@pytest.mark.parametrize("version", [TORCH_2_12, TORCH_2_13, TORCH_2_14])
@pytest.mark.parametrize("op", BASE_NVCC_ARGS_OPS)
def test_hipcc_gets_cxx20_like_the_host_compiler_from_torch_2_12(flags, version, op):
    kind, results = flags
    assert results[version][op]["cxx"] == ["-std=c++20"]  # host side: already so in 0.19.5 (upstream #8238)
    # pristine: the bug, hipcc stays on C++17
    assert results[version][op]["hipcc"] == (["-std=c++17"] if kind == "pristine" else ["-std=c++20"])


def test_torch_builds_with_the_flag_deepspeed_gives(flags):
    """torch 2.13's own JIT writer puts its -std=c++20 first and DeepSpeed's flags after it: the last wins."""
    kind, results = flags
    assert results[TORCH_2_13]["quantizer"]["hipcc_effective"] == ("-std=c++17" if kind == "pristine"
                                                                    else "-std=c++20")


@pytest.mark.parametrize("op", BASE_NVCC_ARGS_OPS)
def test_torch_before_2_12_keeps_cxx17(flags, op):
    _, results = flags
    assert results[OLD_TORCH][op] == {"cxx": ["-std=c++17"], "hipcc": ["-std=c++17"],
                                      **({"hipcc_effective": "-std=c++17"} if op == "quantizer" else {})}


def test_ops_that_pass_no_standard_get_torchs_default(flags):
    """fused_adam's nvcc_args() give no -std, so torch's cpp_extension adds its own (c++20 in 2.13)."""
    _, results = flags
    assert results[TORCH_2_13]["fused_adam"] == {"cxx": ["-std=c++20"], "hipcc": [], "hipcc_effective": "-std=c++20"}

"""Patch 0011: device code refuses to compile when ROCM_WAVEFRONT_SIZE is not the target's wavefront.

A probe kernel including the real (hipified) `ds_kernel_utils.h` is compiled with Debian's hipcc for a
wave64 (gfx90a) and a wave32 (gfx1100) target, with the right and the wrong ROCM_WAVEFRONT_SIZE.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.ds_patch import hipcc_device_syntax_check, hipify, requires_hipcc

pytestmark = [pytest.mark.hipcc, requires_hipcc]

PROBE = """#include "ds_kernel_utils.h"
__global__ void probe(int* out) { out[0] = hw_warp_size; }
"""
TARGET_WAVEFRONT = {"gfx90a": 64, "gfx1100": 32}


@pytest.fixture(scope="module")
def hipified_probe(ds_tree: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    kind, tree = ds_tree
    root = tmp_path_factory.mktemp(f"wavefront-probe-{kind}")
    shutil.copy(tree / "csrc" / "includes" / "ds_kernel_utils.h", root)
    (root / "probe.cu").write_text(PROBE)
    hipify(root, [root / "probe.cu"])
    return kind, root / "probe.hip"


@pytest.mark.parametrize("arch", sorted(TARGET_WAVEFRONT))
def test_matching_wavefront_compiles(hipified_probe, arch):
    _, probe = hipified_probe
    result = hipcc_device_syntax_check(probe, arch, defines=[f"ROCM_WAVEFRONT_SIZE={TARGET_WAVEFRONT[arch]}"])
    assert result.ok, result.tail()


@pytest.mark.parametrize("arch", sorted(TARGET_WAVEFRONT))
def test_wrong_wavefront_is_a_compile_error_naming_both_values(hipified_probe, arch):
    kind, probe = hipified_probe
    wrong = 96 - TARGET_WAVEFRONT[arch]  # 64 <-> 32
    result = hipcc_device_syntax_check(probe, arch, defines=[f"ROCM_WAVEFRONT_SIZE={wrong}"])
    if kind == "pristine":  # the bug: wrong kernels compile silently
        assert result.ok, result.tail()
    else:
        assert not result.ok
        assert "static assertion failed" in result.stderr
        assert (f"ROCM_WAVEFRONT_SIZE={wrong} (chosen by the DeepSpeed op builder) does not match this GPU "
                f"target's wavefront size __AMDGCN_WAVEFRONT_SIZE={TARGET_WAVEFRONT[arch]}") in result.stderr

"""Patch 0012: warp-sync shuffles get 64-bit lane masks on ROCm.

Probe kernels using the real (hipified) headers are compiled with Debian's hipcc against
`hip/warp_sync_contract.h`, which declares the `__shfl*_sync` intrinsics with ROCm 6.3's contract
(`sizeof(mask) == 8`, same static_assert message). 0.19.5 fails it; the patched headers pass.
Only the fp6_dequant probe mirrors code DeepSpeed compiles (inference_core_ops); the type_shim and
general_kernels probes call `reduce_block_into_lanes` and use `FINAL_MASK`, which nothing in DeepSpeed
0.19.5 does (docs/patches.md, 0012, "What that reaches").
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from support.ds_patch import hipcc_device_syntax_check, hipify, requires_hipcc

HIP_TEST_DIR = Path(__file__).resolve().parent / "hip"
CONTRACT = HIP_TEST_DIR / "warp_sync_contract.h"
STUBS = HIP_TEST_DIR / "stub"
CONTRACT_ERROR = "The mask must be a 64-bit integer"

# probe name (no "cuda" in it: hipify would rename the file) -> (header in the tree, probe source)
PROBES = {
    "type_shim": ("csrc/includes/type_shim.h", """#include "type_shim.h"
__global__ void probe(float* x, float* out) { out[0] = reduce_block_into_lanes(x, x[threadIdx.x], 1, true); }
"""),
    "general_kernels": ("csrc/includes/general_kernels.h", """#include "general_kernels.h"
__global__ void probe(float* x) { x[0] = __shfl_xor_sync(FINAL_MASK, x[0], 1); }
"""),
    "fp6_dequant": ("deepspeed/inference/v2/kernels/core_ops/cuda_linear/include/utils_paralleldequant.cuh",
                    """#define WARP_SIZE 32  // as configs.h, which the real translation units include first
#include "utils_paralleldequant.cuh"
__global__ void probe(uint32_t* scales, half* shared) { ExtractFromSharedToReg_Scales(scales, shared); }
"""),
}
# Where 0.19.5 passes 32-bit masks in code built for ROCm; evoformer needs CUTLASS, so it is only scanned.
SCANNED = ["csrc/includes", "csrc/deepspeed4science", "deepspeed/inference/v2/kernels"]
MASK_32BIT_LITERAL = re.compile(r"__\w+_sync\(\s*0x[0-9a-fA-F]{1,8}\b(?![uU]?[lL]{2})")


@pytest.fixture(scope="module")
def hipified_probes(ds_tree: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    kind, tree = ds_tree
    root = tmp_path_factory.mktemp(f"warp-sync-{kind}")
    sources = []
    for name, (header, probe) in PROBES.items():
        shutil.copy(tree / header, root)
        (root / f"{name}.cu").write_text(probe)
        sources.append(root / f"{name}.cu")
    hipify(root, sources)
    return kind, {name: root / f"{name}.hip" for name in PROBES}


@pytest.mark.hipcc
@requires_hipcc
@pytest.mark.parametrize("arch", ["gfx90a", "gfx1100"])
@pytest.mark.parametrize("probe", sorted(PROBES))
def test_headers_meet_rocm_64bit_mask_contract(hipified_probes, probe, arch):
    kind, probes = hipified_probes
    result = hipcc_device_syntax_check(probes[probe], arch, defines=["ROCM_WAVEFRONT_SIZE=64"],
                                       include_dirs=[STUBS], extra_args=["-include", str(CONTRACT)])
    if kind == "pristine":  # the bug: ROCm >= 6.3 headers reject the 32-bit masks
        assert not result.ok
        assert CONTRACT_ERROR in result.stderr
    else:
        assert result.ok, result.tail()


@pytest.mark.hipcc
@requires_hipcc
def test_tid_below_32_branch_names_only_lanes_0_to_31(patched_tree, tmp_path):
    """reduce_block_into_lanes shuffles in `if (tid < 32)`: on a wave64 GPU lanes 32..63 do not take part,
    so the mask must be the low 32 bits of the 64-bit mask, not all ones."""
    shutil.copy(patched_tree / "csrc/includes/type_shim.h", tmp_path)
    (tmp_path / "probe.cu").write_text(
        '#include "type_shim.h"\n'
        'static_assert(sizeof(DS_LANES_0_TO_31_MASK) == 8, "64-bit");\n'
        'static_assert(DS_LANES_0_TO_31_MASK == 0x00000000ffffffffULL, "lanes 0..31");\n')
    hipify(tmp_path, [tmp_path / "probe.cu"])
    result = hipcc_device_syntax_check(tmp_path / "probe.hip", "gfx90a", include_dirs=[STUBS])
    assert result.ok, result.tail()


def test_no_32bit_mask_literal_left_in_rocm_built_sources(ds_tree):
    kind, tree = ds_tree
    hits = [f"{path.relative_to(tree)}:{match.group(0)}"
            for directory in SCANNED for path in sorted((tree / directory).rglob("*"))
            if path.suffix in {".h", ".cuh", ".cu", ".cpp"}
            for match in MASK_32BIT_LITERAL.finditer(path.read_text(errors="replace"))]
    if kind == "pristine":
        assert len(hits) == 9, hits  # type_shim.h, evoformer (7), cuda_linear
    else:
        assert hits == []

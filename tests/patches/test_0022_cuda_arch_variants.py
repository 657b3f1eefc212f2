"""Patch 0022: DeepSpeed's CUDA op builders take arch-specific and family-specific targets (9.0a, 10.0f) from
TORCH_CUDA_ARCH_LIST, as PyTorch does, instead of failing on int('0a').

The H100 machine of issue 39 exports TORCH_CUDA_ARCH_LIST=9.0a. `compute_capability_args()` needs no GPU in
cross-compile mode, so the real function runs here, from the setup.py copy (op_builder/) and the run-time
copy (deepspeed/ops/op_builder/) of each tree.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.ds_patch import probe_result

PROBE = """
import json, os, sys
from op_builder.fused_adam import FusedAdamBuilder as SetupBuilder
from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder as RuntimeBuilder
found = {}
for value in json.loads(sys.argv[1]):
    for label, builder in (("setup", SetupBuilder), ("runtime", RuntimeBuilder)):
        os.environ["TORCH_CUDA_ARCH_LIST"] = value
        try:
            flags = builder().compute_capability_args()
            found[f"{label} {value}"] = {"flags": flags, "handed_to_torch": os.environ["TORCH_CUDA_ARCH_LIST"]}
        except Exception as exc:
            found[f"{label} {value}"] = {"error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(found))
"""
CASES = ["9.0a", "8.0+PTX 9.0a", "9.0;10.0f", "8.0;8.6;9.0+PTX"]


def gencode(num: str, code: str = "sm") -> str:
    return f"-gencode=arch=compute_{num},code={code}_{num}"


def test_arch_variants_reach_nvcc(ds_tree: tuple[str, Path]) -> None:
    kind, tree = ds_tree
    found = probe_result(tree, "-c", PROBE, json.dumps(CASES))
    plain = {"flags": [gencode("80"), gencode("86"), gencode("90"), gencode("90", "compute")],
             "handed_to_torch": "8.0;8.6;9.0+PTX"}
    for label in ("setup", "runtime"):
        assert found[f"{label} 8.0;8.6;9.0+PTX"] == plain, found  # no variant: as before, either way
        if kind.startswith("pristine"):
            for value in ("9.0a", "8.0+PTX 9.0a", "9.0;10.0f"):
                assert found[f"{label} {value}"]["error"].startswith("ValueError: invalid literal for int()"), found
            continue
        assert found[f"{label} 9.0a"] == {"flags": [gencode("90a")], "handed_to_torch": "9.0a"}, found
        assert found[f"{label} 8.0+PTX 9.0a"] == {
            "flags": [gencode("80"), gencode("80", "compute"), gencode("90a")],
            "handed_to_torch": "8.0+PTX;9.0a"}, found
        assert found[f"{label} 9.0;10.0f"]["flags"] == [gencode("90"), gencode("100f")], found

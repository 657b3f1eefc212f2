"""Patch 0006 (0.19.5; upstream in 0.19.8): DeepSpeedCPULion's AVX path moves each element by exactly lr.

0.19.5 masks c with -1.0f instead of the sign bit, so on an AVX2/AVX-512 host every element of the vector loop
moves by 0 or 2*lr: verify's cpu_lion failed on the H100 machine of issue 39 with "step 1: DeepSpeedCPULion
differs from plain-PyTorch Lion (sign update) by 0.000100136". The source of every tree is checked here (the
second pin's pristine tree must already carry the sign mask: that is why the patch is dropped there), and the
op of the patched 0.19.5 tree is built and stepped beside the reference; on the pristine tree the same probe
gives 992 of 1000 elements off by lr (the patch header's measurement).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ds_patch import probe_result

PROBE = Path(__file__).parent / "probes" / "cpu_lion_probe.py"
HEADERS = ("csrc/includes/cpu_lion.h", "deepspeed/ops/csrc/includes/cpu_lion.h")


def test_the_avx_path_masks_with_the_sign_bit(ds_tree: tuple[str, Path]) -> None:
    kind, tree = ds_tree
    for header in HEADERS:
        text = (tree / header).read_text()
        if kind == "pristine":  # 0.19.5 as released
            assert "constexpr float neg1 = -1.0f;" in text and "sign_mask" not in text, header
        else:  # patched 0.19.5, and 0.19.8 with or without its series
            assert "constexpr float sign_mask = -0.0f;" in text and "neg1" not in text, header


@pytest.mark.slow
def test_the_patched_op_steps_like_the_reference(patched_tree: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    found = probe_result(patched_tree, PROBE, env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
                                                   "PYTHONPATH": f"{patched_tree}:{repo}"}, timeout=900)
    if not found["simd"]:
        pytest.skip("this CPU has no AVX: the op runs its scalar path, which 0.19.5 already gets right")
    assert all(step["off"] == 0 and step["max_abs_diff"] < 1e-5 for step in found["steps"]), found

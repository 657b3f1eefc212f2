"""The quantizer check's rule (issue 39), against DeepSpeed's symmetric int8 written out in torch
(csrc/includes/quantization_utils.h: scale 2^8 / (2 max|x|), round to nearest, clamp to [-128, 127], fp16
out). On the H100 the first rule ("within one step of max|x|/127") failed DeepSpeed's own kernel at 1.04
steps: the largest value of a group rounds to 128 and is clamped to 127, a whole step, plus fp16 rounding."""

from __future__ import annotations

import pytest

from mlstack_ds.worker import kernel_checks

torch = pytest.importorskip("torch")


def deepspeed_symmetric(groups, rounding=torch.round):
    scale = 128 / groups.abs().amax(dim=1, keepdim=True)
    q = rounding(groups * scale).clamp(-128, 127)
    return (q / scale).half().float()


def values(groups=kernel_checks.QUANT_GROUPS):
    gen = torch.Generator().manual_seed(11)
    return torch.randn(kernel_checks.QUANT_NUMEL, generator=gen).half().float().reshape(groups, -1)


def worst(groups, restored) -> tuple[float, int]:
    error, allowed, clamped = kernel_checks.quantization_bounds(torch, groups, restored)
    return float((error / allowed).max()), clamped


def test_deepspeeds_rounding_passes_and_its_clamped_maxima_need_the_whole_step() -> None:
    groups = values()
    ratio, clamped = worst(groups, deepspeed_symmetric(groups))
    assert ratio <= 1.0 and clamped >= 1
    error = (deepspeed_symmetric(groups) - groups).abs()
    step = groups.abs().amax(dim=1, keepdim=True) / 128
    assert float((error / step).max()) > 0.9  # the clamp: what failed the first rule on the H100


def test_truncation_and_a_wrong_grouping_fail() -> None:
    groups = values()
    assert worst(groups, deepspeed_symmetric(groups, torch.trunc))[0] > 1.0
    # scales of 4 groups applied to 16: the small groups' values lose most of their precision
    coarse = deepspeed_symmetric(groups.reshape(4, -1)).reshape(groups.shape)
    assert worst(groups, coarse)[0] > 1.0

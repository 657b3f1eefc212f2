"""The formulas the guide's cells are judged by: model-state bytes per GPU and training FLOP per sample.

Why here and pure: a claimed number ("24.8 GB", "5.7 samples/s") is checked against arithmetic, not
against another claim. Model states follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", section 5 and figure 1): mixed-precision Adam
keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and KΨ of optimizer states (K = 12: fp32
master weights, momentum, variance); stage 1 partitions the optimizer states over the N data-parallel
GPUs, stage 2 the gradients too, stage 3 the parameters too. Beside them, DeepSpeed's own estimators
(`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs` in
deepspeed/runtime/zero/stage_1_and_2.py and stage3.py), which are more conservative. FLOP per sample:
6·N·T for the dense matrix products of forward and backward (Kaplan et al. 2020, section 2.1) plus
12·L·h·T² for attention's two T×T products per layer (forward 4·T²·h, backward twice that; the term
PaLM's appendix B and Megatron-LM count). Activation recomputation would add a forward pass; it is left
out, so every bound here is the one most favourable to the claim.
"""

from __future__ import annotations

import math

from mlstack_ds.config.model import GPT_POSITIONS, ModelShape

ADAM_K = 12  # bytes of optimizer state per parameter in mixed-precision Adam (the ZeRO paper's K)
STAGES = ("ddp", "0", "1", "2", "3")


def zero_model_states(params: int, stage: str, gpus: int) -> int:
    """Bytes of model states per GPU by the ZeRO paper: (2 + 2 + K)Ψ with the stage's parts divided by N.
    `ddp` and stage 0 partition nothing."""
    if stage not in STAGES or gpus < 1:
        raise ValueError(f"stage {stage!r} on {gpus} GPU(s)")
    weights, grads, optim = 2 * params, 2 * params, ADAM_K * params
    if stage in ("1", "2", "3"):
        optim = optim / gpus
    if stage in ("2", "3"):
        grads = grads / gpus
    if stage == "3":
        weights = weights / gpus
    return math.ceil(weights + grads + optim)


def deepspeed_estimate(shape: ModelShape, stage: str, gpus: int, *, offload_optimizer: bool = False,
                       offload_param: bool = False) -> int | None:
    """GPU bytes per rank by DeepSpeed's estimators (the same arithmetic, without starting DeepSpeed):
    ZeRO-2 `4Ψ + 16Ψ/N` (with the optimizer offloaded `2Ψ`), ZeRO-3 `4·largest_layer + 18Ψ/N` (optimizer
    offloaded `4·largest_layer + 2Ψ/N`, parameters too `4·largest_layer`). None where DeepSpeed has none
    (plain DDP, stages 0 and 1)."""
    psi, largest = shape.params, 4 * shape.largest_layer_params
    if stage == "2":
        return 2 * psi if offload_optimizer else 4 * psi + int(16 * psi / gpus)
    if stage == "3":
        if offload_param:
            return largest
        return largest + int((2 if offload_optimizer else 18) * psi / gpus)
    return None


def offload_floor(shape: ModelShape, stage: str, gpus: int) -> int | None:
    """The least GPU memory the stage can hold its model states in with everything it can offload
    offloaded (DeepSpeed's estimate): what a number below the no-offload states would have needed."""
    if stage == "3":
        return deepspeed_estimate(shape, "3", gpus, offload_optimizer=True, offload_param=True)
    if stage == "2":
        return deepspeed_estimate(shape, "2", gpus, offload_optimizer=True)
    return None


def attention_coefficient(shape: ModelShape) -> int:
    """FLOP per sample per T² (the attention scores and their use, forward and backward): 12·L·h."""
    return 12 * shape.layers * shape.hidden


def matmul_params(shape: ModelShape) -> int:
    """N of 6·N·T: the parameters that take part in a matrix product. A preset's learned positions
    (2048·h) are looked up, not multiplied, so they are left out; its tied embedding stays in, since the
    output head multiplies by it."""
    return shape.params - GPT_POSITIONS * shape.hidden if shape.source == "preset" else shape.params


def flops_per_sample(shape: ModelShape, seq_len: int) -> float:
    """Training FLOP for one sequence of `seq_len` tokens: 6·N·T + 12·L·h·T²."""
    return 6.0 * matmul_params(shape) * seq_len + attention_coefficient(shape) * float(seq_len) ** 2


def longest_sequence(samples_per_s: float, shape: ModelShape, peak_flops: float) -> int:
    """The longest sequence (whole tokens) at which `samples_per_s` needs at most `peak_flops`: the
    positive root of 12·L·h·T² + 6·N·T = peak / rate, rounded down. 0 when not even one token fits."""
    if samples_per_s <= 0:
        raise ValueError("a rate must be positive")
    budget = peak_flops / samples_per_s
    a, b = float(attention_coefficient(shape)), 6.0 * matmul_params(shape)
    root = (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    longest = math.floor(root)
    # floating point: make sure the answer is on the right side of the bound
    while longest > 0 and flops_per_sample(shape, longest) * samples_per_s > peak_flops:
        longest -= 1
    while flops_per_sample(shape, longest + 1) * samples_per_s <= peak_flops:
        longest += 1
    return longest

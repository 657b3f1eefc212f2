"""The prebuilt kernels that are not optimizers, each against plain PyTorch on the rank's device.

`prebuilt_ops` proves these load; these checks prove they compute. Each runs the op the way DeepSpeed itself
calls it (the checkpoint writer's byte view, ZeRO++'s weight quantizer, random-LTD's token sort, gather and scatter)
and compares with the same operation written in torch: bitwise where the op only moves data, within the
quantization step where it rounds.
"""

from __future__ import annotations

from .context import accelerator
from .env_checks import expected_ops
from .optimizer_checks import require_built
from .protocol import Check, CheckFailed, SkipCheck

BYTE_CAST_SHAPES = ((256, 64), (1000,), (33, 7))
# ZeRO++ (qwZ) quantizes weights in groups of up to 8000 elements to int8, symmetric: one scale per group.
QUANT_NUMEL, QUANT_GROUPS = 64 * 1024, 16
# DeepSpeed's symmetric int8 (csrc/includes/quantization_utils.h): scale = 2^8 / (2 * max|x|) per group, round to
# nearest, clamp to [-128, 127]. So every value comes back within half a step (max|x| / 128) of itself, except
# those that round to 128 and are clamped to 127, within a whole step; the dequantized values are fp16, which
# rounds once more by up to 2^-11 of |x|. A wrong kernel (scale, grouping, rounding) misses by many steps.
# Measured on an H100 (0.19.5, sm_90a): 1.04 steps of max|x| / 127 at worst, which is 1.05 of max|x| / 128,
# an element clamped at the top.
QUANT_LEVELS = 128
FP16_ROUNDING = 2.0**-11
# Built on some platform, proven to load by `prebuilt_ops`, and not yet computed against a reference by verify:
# the training and inference transformer kernels (CUDA). Their checks are written (transformer_checks.py) from
# upstream's tests and tolerances, but join the table only once a GPU run has measured their margins; until then
# the GPU check runs them (tests/gpu/test_transformer_kernels.py) and `untested_ops` names these ops in a skip.
# A unit test keeps this list equal to what the table leaves untested.
OPS_WITHOUT_NUMERICAL_TEST = ("transformer", "stochastic_transformer", "transformer_inference")
LTD_BATCH, LTD_SEQ, LTD_KEPT, LTD_CHANNELS, LTD_LAYERS = 4, 128, 48, 64, 2  # channels: a multiple of 8


def check_utils(ctx):
    """UtilsBuilder's cast_to_byte_tensor (what deepspeed.io's FastFileWriter writes checkpoints through): the
    bytes of each tensor, as a uint8 view of the same memory, == torch's own view, bitwise."""
    require_built(ctx, "utils")
    torch = ctx.torch
    from deepspeed.ops.op_builder import UtilsBuilder  # noqa: PLC0415

    device = accelerator().current_device_name()
    gen = torch.Generator().manual_seed(7)
    tensors = [torch.randn(s, generator=gen).to(device) for s in BYTE_CAST_SHAPES]
    tensors.append(torch.arange(12, dtype=torch.int64).to(device))
    utils = UtilsBuilder().load()
    problems = []
    one = utils.cast_to_byte_tensor(tensors[0])
    if not same_bytes(torch, one, tensors[0]):
        problems.append("cast_to_byte_tensor(tensor) is not the tensor's bytes")
    wrong = [i for i, (got, src) in enumerate(zip(utils.cast_to_byte_tensor(tensors), tensors, strict=True))
             if not same_bytes(torch, got, src)]
    if wrong:
        problems.append(f"cast_to_byte_tensor(list) returned {len(wrong)} of {len(tensors)} wrong (first: #{wrong[0]})")
    details = {"tensors": len(tensors), "bytes": sum(t.nbytes for t in tensors), "device": str(tensors[0].device),
               "reference": "tensor.reshape(-1).view(torch.uint8), same memory"}
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def same_bytes(torch, got, src):
    want = src.reshape(-1).view(torch.uint8)
    return (got.dtype == torch.uint8 and got.device == src.device and got.data_ptr() == src.data_ptr()
            and torch.equal(got.reshape(-1), want))


def check_quantizer(ctx):
    """ZeRO++'s weight quantizer (CUDAQuantizer: int8, symmetric, one scale per group) round trip within what
    rounding to nearest allows for every element, and not trivially (the values really were quantized)."""
    require_built(ctx, "quantizer")
    torch = ctx.torch
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer  # noqa: PLC0415

    device = accelerator().current_device_name()
    gen = torch.Generator().manual_seed(11)
    values = torch.randn(QUANT_NUMEL, generator=gen).to(device=device, dtype=torch.float16)
    quantizer = CUDAQuantizer()
    quantized, scales = quantizer.quantize(values, groups=QUANT_GROUPS)
    restored = quantizer.dequantize(quantized, scales).reshape(-1).float()
    groups = values.float().reshape(QUANT_GROUPS, -1)
    got = restored.reshape(QUANT_GROUPS, -1)
    error, allowed, clamped = quantization_bounds(torch, groups, got)
    worst = float((error / allowed).max())
    step = groups.abs().amax(dim=1, keepdim=True) / QUANT_LEVELS
    details = {"elements": QUANT_NUMEL, "groups": QUANT_GROUPS, "quantized_dtype": str(quantized.dtype),
               "max_error_in_steps": round(float((error / step).max()), 4), "worst_against_bound": round(worst, 4),
               "clamped_at_max": clamped, "distinct_levels": int(torch.unique(quantized).numel()),
               "device": str(values.device)}
    problems = []
    if quantized.dtype != torch.int8 or quantized.numel() != QUANT_NUMEL:
        problems.append(f"quantize returned {quantized.numel()} elements of {quantized.dtype}, expected "
                        f"{QUANT_NUMEL} of torch.int8")
    if not worst <= 1.0:
        problems.append(f"dequantize(quantize(x)) misses x by {details['max_error_in_steps']:.3g} quantization steps "
                        f"(max|x|/128 of its group) somewhere, {worst:.3g} times what rounding to nearest allows "
                        "(half a step; a whole one where clamped at +max; plus fp16 rounding)")
    if details["distinct_levels"] < 64:
        problems.append(f"only {details['distinct_levels']} int8 levels used for normally distributed values")
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def quantization_bounds(torch, groups, restored):
    """(|error|, what symmetric int8 rounding allows, how many values were clamped at +max): per element, over
    rows that are the quantizer's groups."""
    peak = groups.abs().amax(dim=1, keepdim=True)
    step = peak / QUANT_LEVELS
    clamped = groups > peak * (QUANT_LEVELS - 0.5) / QUANT_LEVELS  # round to 128, stored as 127
    allowed = torch.where(clamped, step, step / 2) + groups.abs() * FP16_ROUNDING + peak * 1e-6
    return (restored - groups).abs(), allowed, int(clamped.sum())


def check_random_ltd(ctx):
    """random-LTD's token sort, gather and scatter (what its layers do to drop tokens) == torch's sort,
    gather and index copy, bitwise."""
    require_built(ctx, "random_ltd")
    torch = ctx.torch
    from deepspeed.ops.op_builder import RandomLTDBuilder  # noqa: PLC0415

    device = accelerator().current_device_name()
    module = RandomLTDBuilder().load()
    gen = torch.Generator().manual_seed(13)
    kept = torch.stack([torch.randperm(LTD_SEQ, generator=gen)[:LTD_KEPT]
                        for _ in range(LTD_LAYERS * LTD_BATCH)]).reshape(LTD_LAYERS, LTD_BATCH, LTD_KEPT)
    unsorted = kept.to(device=device, dtype=torch.int32)
    problems = []
    sorted_ids = module.token_sort_(unsorted.clone(), LTD_SEQ)
    if not torch.equal(sorted_ids, unsorted.sort(dim=-1).values):
        problems.append("token_sort_ differs from torch.sort of the kept token ids")
    indices = unsorted.sort(dim=-1).values[0].contiguous()  # one layer's [batch, kept]
    activations = torch.randn(LTD_BATCH, LTD_SEQ, LTD_CHANNELS, generator=gen).to(device)
    gathered = module.token_gather(activations, indices, True)
    index = indices.long().unsqueeze(-1).expand(-1, -1, LTD_CHANNELS)
    if not torch.equal(gathered, torch.gather(activations, 1, index)):
        problems.append("token_gather differs from torch.gather along the sequence")
    layer_out = torch.randn(LTD_BATCH, LTD_KEPT, LTD_CHANNELS, generator=gen).to(device)
    scattered = module.token_scatter_(activations.clone(), layer_out, indices, True)
    if not torch.equal(scattered, activations.clone().scatter_(1, index, layer_out)):
        problems.append("token_scatter_ differs from torch's scatter along the sequence")
    details = {"layers": LTD_LAYERS, "batch": LTD_BATCH, "sequence": LTD_SEQ, "kept": LTD_KEPT,
               "channels": LTD_CHANNELS, "device": str(activations.device)}
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def check_untested_ops(ctx):
    """A built op without a numerical test is named in a skip, never a failure (and never silently passed)."""
    ctx.need_deepspeed()
    names, source = expected_ops(ctx)
    built = [name for name in OPS_WITHOUT_NUMERICAL_TEST if name in names]
    if not built:
        raise SkipCheck(f"none of {', '.join(OPS_WITHOUT_NUMERICAL_TEST)} is built ({source})")
    raise SkipCheck(f"built and loading (prebuilt_ops), without a numerical test in this suite yet: {', '.join(built)}")


CHECKS = (
    Check("utils", "cast_to_byte_tensor (deepspeed.io's checkpoint writer) equals torch's byte view (skipped "
          "where not built)",
          ("deepspeed", "op:utils"), check_utils),
    Check("quantizer", "ZeRO++'s int8 weight quantizer round trip within one quantization step (skipped where "
          "not built)", ("deepspeed", "op:quantizer"), check_quantizer),
    Check("random_ltd", "random-LTD token sort, gather and scatter equal torch's, bitwise (skipped where not built)",
          ("deepspeed", "op:random_ltd"), check_random_ltd),
    Check("untested_ops", "names the built ops this suite has no numerical test for yet (always a skip)",
          ("deepspeed", *(f"op:{name}" for name in OPS_WITHOUT_NUMERICAL_TEST)), check_untested_ops),
)

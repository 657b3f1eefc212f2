"""DeepSpeed's optimizers against plain PyTorch, step by step on the same gradients, on the rank's device.

Adam and Adagrad are compared with torch.optim; LAMB and Lion, which torch.optim lacks, with the references in
`optimizer_references`. DeepSpeed's optimizer and its reference always run on the same device (the GPU ops on
the rank's accelerator, the CPU ops on the CPU), so what is measured is the kernel and not a device's
arithmetic. The starting values and gradients are drawn on the CPU from one seed and then moved: the same
numbers on every platform, whatever its random number generator.
"""

from __future__ import annotations

from .context import accelerator
from .env_checks import expected_ops
from .optimizer_references import ReferenceOptimizer, lamb_update, lion_update
from .protocol import Check, CheckFailed, SkipCheck
from .training import ADAM, OPTIMIZER_ATOL, OPTIMIZER_STEPS

SHAPES = ((256, 64), (1000,), (33, 7))
LAMB = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "max_coeff": 10.0, "min_coeff": 0.01}
LION = {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.01}
ADAGRAD = {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0}  # DeepSpeed adds decay to the accumulator only
# Lion moves every element by exactly lr, in the direction of sign(c). Where c is within rounding of 0 the
# kernel and the reference may round it to opposite signs (fused multiply-add against two operations); such
# an element then differs by 2*lr for good. Those elements (|c| below this, in the reference) are left out of
# the comparison and counted; with this suite's gradients (~N(0, 1)) |c| is rarely below 1e-3.
LION_TIE = 1e-6
LION_TIE_SHARE = 1e-3  # more ties than this is not rounding


def optimizer_case(torch, device, steps=OPTIMIZER_STEPS):
    """(starting tensors, gradients per step), drawn on the CPU from one seed and placed on `device`."""
    gen = torch.Generator().manual_seed(99)
    start = [torch.randn(s, generator=gen).to(device) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen).to(device) for s in SHAPES] for _ in range(steps)]
    return start, grads


def optimizer_against_reference(ctx, make_ds, make_ref, *, label, reference, device, atol=OPTIMIZER_ATOL,
                                ties=None):
    """Step `make_ds(params)` and `make_ref(params)` side by side on `device` and judge the largest
    parameter difference after each step. `ties(ref_optimizer)` returns per-tensor masks of elements whose
    update direction is a rounding tie (Lion); those are left out and counted."""
    torch = ctx.torch
    start, grads = optimizer_case(torch, device)
    ds_params = [torch.nn.Parameter(t.clone()) for t in start]
    ref_params = [torch.nn.Parameter(t.clone()) for t in start]
    ds_opt, ref_opt = make_ds(ds_params), make_ref(ref_params)
    masks = [torch.zeros(t.shape, dtype=torch.bool, device=device) for t in start]
    worst = 0.0
    details = {"steps": OPTIMIZER_STEPS, "tolerance": atol, "reference": reference, "device": str(device)}
    for step, step_grads in enumerate(grads, start=1):
        for p, q, g in zip(ds_params, ref_params, step_grads, strict=True):
            p.grad = g.clone()
            q.grad = g.clone()
        ds_opt.step()
        ref_opt.step()
        if ties is not None:
            masks = [m | t for m, t in zip(masks, ties(ref_opt), strict=True)]
        diff = max(float((p.detach() - q.detach()).abs().masked_fill(m, 0).max())
                   for p, q, m in zip(ds_params, ref_params, masks, strict=True))
        worst = max(worst, diff)
        details["max_abs_diff"] = worst
        if not diff <= atol:
            raise CheckFailed(f"step {step}: {label} differs from {reference} by {diff:g} (tolerance {atol:g})",
                              details)
    if ties is not None:
        tied, total = sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)
        details.update(tied_elements=tied, elements=total, tie_threshold=LION_TIE)
        if tied > LION_TIE_SHARE * total:
            raise CheckFailed(f"{label}: {tied} of {total} elements had |c| <= {LION_TIE:g} at some step; more than "
                              f"{LION_TIE_SHARE:g} of them is not rounding", details)
    return details


def require_built(ctx, op_name):
    """Skip, naming where that was read, when `op_name` was not built ahead of time for this install."""
    ctx.need_deepspeed()
    names, source = expected_ops(ctx)
    if op_name not in names:
        raise SkipCheck(f"{op_name} is not built ({source})")


def lion_ties(ref_opt):
    return [extra <= LION_TIE if extra is not None else None for extra in ref_opt.extras]


def check_fused_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import FusedAdam  # noqa: PLC0415

    return optimizer_against_reference(ctx, lambda ps: FusedAdam(ps, adam_w_mode=True, **ADAM),
                                       lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), label="FusedAdam",
                                       reference="torch.optim.AdamW", device=accelerator().current_device_name())


def check_cpu_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: PLC0415

    return optimizer_against_reference(ctx, lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **ADAM),
                                       lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), label="DeepSpeedCPUAdam",
                                       reference="torch.optim.AdamW", device="cpu")


def check_fused_lamb(ctx):
    require_built(ctx, "fused_lamb")
    from deepspeed.ops.lamb import FusedLamb  # noqa: PLC0415

    hyper = dict(LAMB)
    return optimizer_against_reference(
        ctx, lambda ps: FusedLamb(ps, **hyper),
        lambda ps: ReferenceOptimizer(ps, lambda p, g, s: lamb_update(p, g, s, **hyper)), label="FusedLamb",
        reference="plain-PyTorch LAMB (per-tensor trust ratio)", device=accelerator().current_device_name())


def check_fused_lion(ctx):
    require_built(ctx, "fused_lion")
    from deepspeed.ops.lion import FusedLion  # noqa: PLC0415

    return optimizer_against_reference(
        ctx, lambda ps: FusedLion(ps, **LION),
        lambda ps: ReferenceOptimizer(ps, lambda p, g, s: lion_update(p, g, s, **LION)), label="FusedLion",
        reference="plain-PyTorch Lion (sign update)", device=accelerator().current_device_name(), ties=lion_ties)


def check_cpu_lion(ctx):
    require_built(ctx, "cpu_lion")
    from deepspeed.ops.lion import DeepSpeedCPULion  # noqa: PLC0415

    return optimizer_against_reference(
        ctx, lambda ps: DeepSpeedCPULion(ps, **LION),
        lambda ps: ReferenceOptimizer(ps, lambda p, g, s: lion_update(p, g, s, **LION)), label="DeepSpeedCPULion",
        reference="plain-PyTorch Lion (sign update)", device="cpu", ties=lion_ties)


def check_cpu_adagrad(ctx):
    require_built(ctx, "cpu_adagrad")
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad  # noqa: PLC0415

    return optimizer_against_reference(ctx, lambda ps: DeepSpeedCPUAdagrad(ps, **ADAGRAD),
                                       lambda ps: ctx.torch.optim.Adagrad(ps, **ADAGRAD), label="DeepSpeedCPUAdagrad",
                                       reference="torch.optim.Adagrad", device="cpu")


CHECKS = (
    Check("fused_adam", "FusedAdam matches torch.optim.AdamW over 10 steps", ("deepspeed", "op:fused_adam"),
          check_fused_adam),
    Check("cpu_adam", "DeepSpeedCPUAdam matches torch.optim.AdamW over 10 steps", ("deepspeed", "op:cpu_adam"),
          check_cpu_adam),
    Check("fused_lamb", "FusedLamb matches a plain-PyTorch LAMB over 10 steps (skipped where not built)",
          ("deepspeed", "op:fused_lamb"), check_fused_lamb),
    Check("fused_lion", "FusedLion matches a plain-PyTorch Lion over 10 steps (skipped where not built)",
          ("deepspeed", "op:fused_lion"), check_fused_lion),
    Check("cpu_adagrad", "DeepSpeedCPUAdagrad matches torch.optim.Adagrad over 10 steps (skipped where not built)",
          ("deepspeed", "op:cpu_adagrad"), check_cpu_adagrad),
    Check("cpu_lion", "DeepSpeedCPULion matches a plain-PyTorch Lion over 10 steps (skipped where not built)",
          ("deepspeed", "op:cpu_lion"), check_cpu_lion),
)

"""DeepSpeed's optimizers against torch.optim, step by step on the same gradients."""

from __future__ import annotations

from .context import accelerator
from .env_checks import expected_ops
from .protocol import Check, CheckFailed, SkipCheck
from .training import ADAM, OPTIMIZER_ATOL, OPTIMIZER_STEPS


def optimizer_against_torch(ctx, make_ds, make_ref, label, device="cpu"):
    torch = ctx.torch
    gen = torch.Generator().manual_seed(99)
    shapes = [(256, 64), (1000,), (33, 7)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(OPTIMIZER_STEPS)]
    ds_params = [torch.nn.Parameter(t.clone().to(device)) for t in start]
    ref_params = [torch.nn.Parameter(t.clone()) for t in start]
    ds_opt, ref_opt = make_ds(ds_params), make_ref(ref_params)
    worst = 0.0
    for step, step_grads in enumerate(grads, start=1):
        for p, q, g in zip(ds_params, ref_params, step_grads, strict=True):
            p.grad = g.clone().to(device)
            q.grad = g.clone()
        ds_opt.step()
        ref_opt.step()
        diff = max(float((p.detach().cpu() - q.detach()).abs().max()) for p, q in zip(ds_params, ref_params,
                                                                                     strict=True))
        worst = max(worst, diff)
        if not diff <= OPTIMIZER_ATOL:
            raise CheckFailed(f"step {step}: {label} differs from torch by {diff:g} "
                              f"(tolerance {OPTIMIZER_ATOL:g})", {"max_abs_diff": worst})
    return {"steps": OPTIMIZER_STEPS, "max_abs_diff": worst, "tolerance": OPTIMIZER_ATOL,
            "reference": "torch.optim.AdamW"}


def check_fused_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import FusedAdam  # noqa: PLC0415

    device = accelerator().current_device_name()
    return optimizer_against_torch(ctx, lambda ps: FusedAdam(ps, adam_w_mode=True, **ADAM),
                                   lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), "FusedAdam", device)


def check_cpu_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: PLC0415

    return optimizer_against_torch(ctx, lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **ADAM),
                                   lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), "DeepSpeedCPUAdam")


def check_only_if_built(op_name):
    def check(ctx):
        ctx.need_deepspeed()
        names, source = expected_ops(ctx)
        if op_name not in names:
            raise SkipCheck(f"{op_name} is not built ({source})")
        raise CheckFailed(f"{op_name} is built but this suite has no numerical test for it yet")

    return check


CHECKS = (
    Check("fused_adam", "FusedAdam matches torch.optim.AdamW over 10 steps", ("deepspeed", "op:fused_adam"),
          check_fused_adam),
    Check("cpu_adam", "DeepSpeedCPUAdam matches torch.optim.AdamW over 10 steps", ("deepspeed", "op:cpu_adam"),
          check_cpu_adam),
    Check("fused_lamb", "FusedLamb, where built (skipped otherwise)", ("deepspeed", "op:fused_lamb"),
          check_only_if_built("fused_lamb")),
    Check("fused_lion", "FusedLion, where built (skipped otherwise)", ("deepspeed", "op:fused_lion"),
          check_only_if_built("fused_lion")),
)

"""ZeRO training: every stage and offload against the torch reference, precision, checkpoints."""

from __future__ import annotations

import shutil

from .context import accelerator
from .protocol import Check, CheckFailed, SkipCheck
from .training import (
    LOSS_RTOL,
    LOW_PRECISION_RTOL,
    STEPS,
    PairedRun,
    compare_curves,
    ds_config,
    full_parameters,
    partition_details,
    train_and_judge,
)


def check_zero(stage, offload_optimizer=False, offload_param=False):
    def check(ctx):
        config = ds_config(stage, offload_optimizer, offload_param)
        return train_and_judge(ctx, config, inspect=partition_details(ctx, stage))

    return check


def check_precision(ctx):
    ctx.need_dist()
    acc = accelerator()
    results, skipped = {}, {}
    for precision, supported in (("bf16", acc.is_bf16_supported()), ("fp16", acc.is_fp16_supported())):
        if not supported:
            skipped[precision] = f"{acc._name} accelerator reports no {precision} support"
            continue
        if precision == "fp16" and acc._name == "cpu":
            skipped[precision] = "fp16 training needs a GPU loss scaler path; not run on the CPU accelerator"
            continue
        results[precision] = train_and_judge(ctx, ds_config(2, precision=precision), rtol=LOW_PRECISION_RTOL)
    if not results:
        raise SkipCheck("; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return {"ran": results, "skipped": skipped}


def check_checkpoint(ctx):
    """ZeRO-3: train, save, load into a fresh engine (other seed), compare weights, train on."""
    ctx.need_dist()
    torch = ctx.torch
    ckpt_dir = ctx.out_dir / "checkpoint"
    config = ds_config(3)
    first = PairedRun(ctx, config)
    try:
        first.run(STEPS // 2)
        first.engine.save_checkpoint(str(ckpt_dir), tag="verify")
        saved = full_parameters(ctx, first.engine)
        reference, ref_optimizer = first.reference, first.ref_optimizer
        losses, ref_losses = list(first.losses), list(first.ref_losses)
    finally:
        first.destroy()
    del first
    second = PairedRun(ctx, config, seed=777)
    try:
        second.engine.load_checkpoint(str(ckpt_dir), tag="verify")
        loaded = full_parameters(ctx, second.engine)
        mismatched = [i for i, (a, b) in enumerate(zip(saved, loaded, strict=True)) if not torch.equal(a, b)]
        second.reference, second.ref_optimizer = reference, ref_optimizer
        second.run(STEPS - STEPS // 2)
        losses += second.losses
        ref_losses += second.ref_losses
        details = {"saved_tensors": len(saved), "mismatched_after_reload": len(mismatched),
                   "losses": [round(v, 6) for v in losses],
                   "reference_losses": [round(v, 6) for v in ref_losses],
                   "reloaded_at_step": STEPS // 2 + 1}
        problems = [f"{len(mismatched)} of {len(saved)} parameters differ after reload"] if mismatched else []
        deviation = compare_curves(losses, ref_losses, LOSS_RTOL)
        if deviation:
            problems.insert(0, deviation)
        if problems:
            raise CheckFailed("; ".join(problems), details)
        return details
    finally:
        second.destroy()
        if ctx.rank == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)


CHECKS = (
    Check("zero1", "ZeRO-1 training matches a torch AdamW copy; optimizer state partitioned",
          ("deepspeed", "distributed"), check_zero(1)),
    Check("zero2", "ZeRO-2 training matches a torch AdamW copy; optimizer state partitioned",
          ("deepspeed", "distributed"), check_zero(2)),
    Check("zero3", "ZeRO-3 training matches a torch AdamW copy; parameters partitioned ~1/N",
          ("deepspeed", "distributed"), check_zero(3)),
    Check("zero2_offload", "ZeRO-2 with the optimizer offloaded to CPU (cpu_adam)",
          ("deepspeed", "distributed", "op:cpu_adam"), check_zero(2, offload_optimizer=True)),
    Check("zero3_offload", "ZeRO-3 with optimizer and parameters offloaded to CPU",
          ("deepspeed", "distributed", "op:cpu_adam"), check_zero(3, offload_optimizer=True, offload_param=True)),
    Check("precision", "bf16 / fp16 training where the device supports it", ("deepspeed", "distributed"),
          check_precision),
    Check("checkpoint", "ZeRO-3 save and load round trip; identical weights, training continues",
          ("deepspeed", "distributed"), check_checkpoint),
)

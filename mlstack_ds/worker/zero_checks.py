"""ZeRO training: every stage and offload against the torch reference, precision, checkpoints."""

from __future__ import annotations

import shutil

from .context import accelerator
from .env_checks import expected_ops
from .protocol import Check, CheckFailed, JitBuildRefused, SkipCheck
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


ZERO_TO_FP32_STEPS = 2  # enough for the master weights to move away from the initial ones


def check_zero_to_fp32(ctx):
    """ZeRO-3 checkpoint consolidated by DeepSpeed's own tool == the parameters gathered from the live engine.

    `get_fp32_state_dict_from_zero_checkpoint` is what the `zero_to_fp32.py` script that save_checkpoint
    writes next to the shards runs; it rebuilds each tensor from the per-rank fp32 partitions, so a wrong
    offset or padding shows as a mismatch here and nowhere in training.
    """
    ctx.need_dist()
    torch = ctx.torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: PLC0415

    ckpt_dir = ctx.out_dir / "zero_to_fp32"
    run = PairedRun(ctx, ds_config(3))
    try:
        run.run(ZERO_TO_FP32_STEPS)
        run.engine.save_checkpoint(str(ckpt_dir), tag="verify")
        names = [name for name, _ in run.engine.module.named_parameters()]
        live = full_parameters(ctx, run.engine)
    finally:
        run.destroy()
    torch.distributed.barrier()  # every rank's shards are on disk before rank 0 reads them
    verdict = [None]
    try:
        if ctx.rank == 0:
            try:
                state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag="verify")
                verdict[0] = compare_consolidated(torch, state, names, live)
            except Exception as exc:  # reported by every rank, not only the one that read the files
                error = f"{type(exc).__name__}: {exc}"[:2000]
                verdict[0] = ({"error": error}, [f"get_fp32_state_dict_from_zero_checkpoint failed on the "
                                                 f"ZeRO-3 checkpoint: {error}"])
        torch.distributed.broadcast_object_list(verdict, src=0)
    finally:
        torch.distributed.barrier()
        if ctx.rank == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    details, problems = verdict[0]
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def compare_consolidated(torch, state, names, live):
    """(details, problems): the consolidated fp32 state dict against the live parameters (float64 copies), bitwise."""
    missing = [n for n in names if n not in state]
    extra = sorted(set(state) - set(names))
    mismatched, not_fp32, worst = [], [], 0.0
    for name, want in zip(names, live, strict=True):
        got = state.get(name)
        if got is None:
            continue
        if got.dtype != torch.float32:
            not_fp32.append(f"{name} ({got.dtype})")
        if tuple(got.shape) != tuple(want.shape):
            mismatched.append(f"{name} (shape {tuple(got.shape)} vs {tuple(want.shape)})")
            continue
        got = got.detach().to("cpu", torch.float64)
        if not torch.equal(got, want):
            mismatched.append(name)
            worst = max(worst, float((got - want).abs().max()))
    problems = []
    if missing or extra:
        problems.append(f"the consolidated state dict has {len(state)} tensors for {len(names)} parameters "
                        f"(missing {missing[:3]}, unexpected {extra[:3]})")
    if mismatched:
        problems.append(f"{len(mismatched)} of {len(names)} consolidated tensors differ from the live engine's "
                        f"parameters (max abs diff {worst:g}; first: {mismatched[0]})")
    if not_fp32:
        problems.append(f"consolidated tensors are not fp32: {not_fp32[:3]}")
    details = {"tensors": len(state), "parameters": len(names), "mismatches": len(mismatched),
               "max_abs_diff": worst, "missing": missing[:10], "unexpected": extra[:10], "steps": ZERO_TO_FP32_STEPS,
               "reference": "engine parameters gathered one by one (GatheredParameters)"}
    return details, problems


# NVMe offload: every buffer is sized for this suite's model (the largest ZeRO-3 partition is half of a
# 1024x128 weight on 2 ranks; the whole of one on 1 rank), so the run allocates a few MiB, not DeepSpeed's
# defaults (5 x 1e8 elements for parameters).
NVME_PARAM_BUFFER_NUMEL = 1 << 17
NVME_PARAM_BUFFERS = 5
NVME_OPTIMIZER_BUFFERS = 4
NVME_AIO = {"block_size": 1 << 18, "queue_depth": 4, "intra_op_parallelism": 1, "single_submit": False,
            "overlap_events": True}


def nvme_config(nvme_path):
    """ZeRO-3 with optimizer state and parameters swapped through async_io to files under `nvme_path`."""
    config = ds_config(3)
    config["zero_optimization"]["offload_optimizer"] = {
        "device": "nvme", "nvme_path": str(nvme_path), "pin_memory": False, "buffer_count": NVME_OPTIMIZER_BUFFERS}
    config["zero_optimization"]["offload_param"] = {
        "device": "nvme", "nvme_path": str(nvme_path), "pin_memory": False, "buffer_count": NVME_PARAM_BUFFERS,
        "buffer_size": NVME_PARAM_BUFFER_NUMEL, "max_in_cpu": 0}
    config["aio"] = dict(NVME_AIO)
    return config


def check_nvme_offload(ctx):
    ctx.need_deepspeed()
    names, source = expected_ops(ctx)
    if "async_io" not in names:  # does not apply, whatever else is wrong (as hf_trainer without transformers)
        raise SkipCheck(f"async_io is not prebuilt (no libaio headers at build time?): DeepSpeed would "
                        f"JIT-compile it at the first initialize ({source}); add it with: apt-get install "
                        "libaio-dev (dnf, zypper: libaio-devel), then mlstack-ds install again "
                        "(scripts/install_deepspeed.sh --with-system-deps does both)")
    ctx.need_dist()
    nvme_path = ctx.out_dir / f"nvme-rank{ctx.rank}"
    shutil.rmtree(nvme_path, ignore_errors=True)
    nvme_path.mkdir(parents=True)
    try:
        details = train_and_judge(ctx, nvme_config(nvme_path), inspect=swap_files(nvme_path))
    except JitBuildRefused as exc:
        raise CheckFailed(f"NVMe offload needs an op that is not prebuilt: {exc}") from exc
    except ImportError as exc:  # e.g. an async_io_op built without linking libaio: undefined symbol io_submit
        raise CheckFailed(f"NVMe offload: a prebuilt op does not load: {exc}") from exc
    finally:
        shutil.rmtree(nvme_path, ignore_errors=True)
    return details


def swap_files(nvme_path):
    """Did the swapping really go through files? (An offload quietly kept in memory would not write any.)"""

    def inspect(trainer):
        files = [p for p in nvme_path.rglob("*") if p.is_file()]
        found = {"nvme_swap_files_this_rank": len(files),
                 "nvme_swap_bytes_this_rank": sum(p.stat().st_size for p in files)}
        return found, ([] if files else [f"no swap files under {nvme_path}: nothing was offloaded to NVMe"])

    return inspect


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
    Check("zero_to_fp32", "ZeRO-3 checkpoint consolidated by zero_to_fp32 equals the live parameters bitwise",
          ("deepspeed", "distributed"), check_zero_to_fp32),
    Check("nvme_offload", "ZeRO-3 with optimizer and parameters offloaded to NVMe files (async_io)",
          ("deepspeed", "distributed", "op:async_io", "op:pin_memory", "op:cpu_adam"), check_nvme_offload),
)

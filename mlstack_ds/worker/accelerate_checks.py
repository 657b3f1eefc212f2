"""Hugging Face accelerate driving DeepSpeed (its `DeepSpeedPlugin`, what `accelerate launch` with a DeepSpeed
config sets up), ZeRO-2 and ZeRO-3, against the same steps in plain torch.

On the CPU accelerate picks no process-group backend of its own (`state.py` `_prepare_backend` knows only device
backends) and then counts one process whatever DeepSpeed initialised, so it fills "auto" batch sizes for one rank
and DeepSpeed stops with `AssertionError: Check batch related parameters. train_batch_size is not equal to
micro_batch_per_gpu * gradient_acc_step * world_size 4 != 4 * 1 * 2` (accelerate 1.15.0; reproduced here).
accelerate's own `InitProcessGroupKwargs(backend="gloo")` names the backend and is what a CPU user passes; the
check does the same there and says so in its details.
"""

from __future__ import annotations

import importlib

from .context import accelerator, close
from .hf_checks import restored_environ
from .protocol import Check, CheckFailed, SkipCheck

ACC_STEPS, ACC_MICRO_BATCH, ACC_LR, ACC_CLIP = 5, 4, 0.05, 1.0
ACC_LOSS_RTOL = 1e-5  # fp32, the same arithmetic: measured 0.0 on 2 CPU ranks (0.19.5 and 0.19.8)
CPU_BACKEND_NOTE = ("accelerate picks no backend on the CPU and then counts one process: "
                    "InitProcessGroupKwargs(backend='gloo') given, as a CPU user must")


def import_accelerate(torch):
    try:
        accelerate = importlib.import_module("accelerate")
        from accelerate.state import AcceleratorState, GradientState  # noqa: PLC0415
        from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs  # noqa: PLC0415
    except ImportError as exc:
        raise SkipCheck(f"accelerate is not installed in the target ({type(exc).__name__}: {exc}); add it with: "
                        f"PYTHON -m pip install accelerate torch=={torch.__version__} (torch named so pip keeps it)"
                        ) from None
    return {"accelerate": accelerate, "AcceleratorState": AcceleratorState, "GradientState": GradientState,
            "DeepSpeedPlugin": DeepSpeedPlugin, "InitProcessGroupKwargs": InitProcessGroupKwargs}


def regression_data(torch, world_size):
    """Rows for ACC_STEPS global batches, the same on every rank (the prepared loader gives each rank its share)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(ACC_STEPS * ACC_MICRO_BATCH * world_size, 16, generator=gen)
    return x, x @ torch.randn(16, 1, generator=gen)


def small_model(torch):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def train_through_accelerate(ctx, acc_mod, stage, on_cpu):
    """ACC_STEPS steps of SGD through an Accelerator with a DeepSpeed plugin, beside the same steps in plain
    torch on each step's whole global batch (what the ranks' mean gradient is); (details, problems)."""
    torch = ctx.torch
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": 1, "gradient_clipping": ACC_CLIP, "zero_optimization": {"stage": stage}}
    handlers = [acc_mod["InitProcessGroupKwargs"](backend="gloo")] if on_cpu else []
    with restored_environ():
        try:
            acc = acc_mod["accelerate"].Accelerator(deepspeed_plugin=acc_mod["DeepSpeedPlugin"](hf_ds_config=config),
                                                    kwargs_handlers=handlers)
            problems = []
            if acc.num_processes != ctx.world_size:
                return {}, [f"accelerate counts {acc.num_processes} process(es) of {ctx.world_size}"]
            x, y = regression_data(torch, ctx.world_size)
            reference = small_model(torch).to(acc.device)
            ref_optimizer = torch.optim.SGD(reference.parameters(), lr=ACC_LR)
            model = small_model(torch)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=ACC_MICRO_BATCH)
            engine, optimizer, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=ACC_LR), loader)
            kind = type(engine).__name__
            if kind != "DeepSpeedEngine" or engine.zero_optimization_stage() != stage:
                problems.append(f"accelerate prepared a {kind}, not a DeepSpeedEngine at ZeRO-{stage}")
            losses, ref_losses = [], []
            rows = ACC_MICRO_BATCH * ctx.world_size
            for step, (xb, yb) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(engine(xb), yb)
                acc.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                losses.append(acc.gather(loss.detach().reshape(1)).mean().item())
                window = slice(rows * step, rows * (step + 1))
                gx, gy = x[window].to(acc.device), y[window].to(acc.device)
                ref_loss = torch.nn.functional.mse_loss(reference(gx), gy)
                ref_loss.backward()
                torch.nn.utils.clip_grad_norm_(reference.parameters(), ACC_CLIP)
                ref_optimizer.step()
                ref_optimizer.zero_grad()
                ref_losses.append(ref_loss.item())
            filled = engine.train_batch_size()
        finally:
            acc_mod["AcceleratorState"]._reset_state(reset_partial_state=True)
            acc_mod["GradientState"]._reset_state()
    details = {"losses": [round(v, 6) for v in losses], "reference_losses": [round(v, 6) for v in ref_losses],
               "engine": kind, "train_batch_size": filled}
    if len(losses) != ACC_STEPS:
        problems.append(f"ZeRO-{stage}: {len(losses)} steps ran of {ACC_STEPS}")
    for step, (got, want) in enumerate(zip(losses, ref_losses, strict=False), start=1):
        if not close(got, want, ACC_LOSS_RTOL, ACC_LOSS_RTOL):
            problems.append(f"ZeRO-{stage} step {step}: loss {got:.6f}, plain torch {want:.6f}")
            break
    return details, problems


def check_accelerate_deepspeed(ctx):
    """accelerate's DeepSpeed plugin with "auto" batch sizes, ZeRO-2 and ZeRO-3: a DeepSpeedEngine of the stage
    asked for over every rank, each step's loss that of plain torch on the global batch."""
    ctx.need_dist()
    acc_mod = import_accelerate(ctx.torch)
    on_cpu = accelerator()._name == "cpu"
    details = {"accelerate": acc_mod["accelerate"].__version__, "steps": ACC_STEPS, "rtol": ACC_LOSS_RTOL}
    if on_cpu:
        details["cpu_backend"] = CPU_BACKEND_NOTE
    return each_zero_stage(details, lambda stage: train_through_accelerate(ctx, acc_mod, stage, on_cpu))


def each_zero_stage(details, train):
    """`train(stage)` -> (details, problems) at ZeRO-2 and ZeRO-3, gathered into `details` under zero2/zero3:
    the details, or CheckFailed with every stage's problems (a framework's check: accelerate's, Lightning's)."""
    problems = []
    for stage in (2, 3):
        found, more = train(stage)
        details[f"zero{stage}"] = found
        problems += more
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


CHECKS = (
    Check("accelerate_deepspeed", "accelerate's DeepSpeed plugin (\"auto\" config), ZeRO-2 and ZeRO-3, matches plain "
          "torch step by step (skipped unless accelerate is installed)", ("deepspeed", "distributed",
                                                                             "pkg:accelerate"),
          check_accelerate_deepspeed),
)

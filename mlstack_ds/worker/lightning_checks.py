"""Lightning's `DeepSpeedStrategy` (the DeepSpeed guide's own Lightning example), ZeRO-2 and ZeRO-3, against
the same steps in plain torch.

Lightning refuses DeepSpeed on the CPU by design: `DeepSpeedStrategy.setup_environment` raises "The DeepSpeed
strategy is only supported on CUDA GPUs but `CPUAccelerator` is used." (lightning 2.6.6,
`lightning/pytorch/strategies/deepspeed.py`, since Lightning PR #12699), and no setting gets past it. The check
still asks Lightning every time and reports that refusal, word for word, as its skip: a Lightning that ever
accepts the CPU is checked like a GPU. On ROCm and CUDA machines (the GPU check) it trains.
"""

from __future__ import annotations

import importlib
import os

from .accelerate_checks import (
    ACC_CLIP,
    ACC_LR,
    ACC_MICRO_BATCH,
    ACC_STEPS,
    each_zero_stage,
    regression_data,
    small_model,
)
from .context import accelerator, close
from .hf_checks import restored_environ
from .protocol import Check, SkipCheck

PL_LOSS_RTOL = 1e-5  # fp32, the same arithmetic: 0.0 measured on 2 CPU ranks with the refusal lifted (tests)
CPU_REFUSAL = "only supported on CUDA GPUs"  # Lightning's refusal, the part every 2.x release words the same
REFUSAL_CAUSE = ("Lightning runs DeepSpeed only on GPUs, by design (Lightning PR #12699), so this check runs in "
                 "the GPU check")


def import_lightning(torch):
    """`lightning.pytorch` (the unified package), else the older standalone `pytorch_lightning`."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = importlib.import_module(name)
            strategies = importlib.import_module(f"{name}.strategies")
        except ImportError as exc:
            missing = exc
            continue
        return module, strategies.DeepSpeedStrategy
    raise SkipCheck(f"lightning is not installed in the target ({type(missing).__name__}: {missing}); add it with: "
                    f"PYTHON -m pip install lightning torch=={torch.__version__} (torch named so pip keeps it)")


def rank_batches(torch, world_size, rank):
    """Rank `rank`'s rows in the layout of accelerate's prepared loader (batch b goes to rank b % world_size), so
    step s covers the global batch of rows [s*W*B, (s+1)*W*B): the same steps as accelerate_deepspeed."""
    rows = [row for batch in range(rank, ACC_STEPS * world_size, world_size)
            for row in range(batch * ACC_MICRO_BATCH, (batch + 1) * ACC_MICRO_BATCH)]

    class InOrder(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(rows)

        def __len__(self):
            return len(rows)

    return InOrder()


def lightning_module(pl, torch):
    """The accelerate check's model in a LightningModule that records each step's loss, averaged over ranks."""

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = small_model(torch)
            self.losses: list[float] = []
            self.engine = ""

        def on_train_start(self):
            self.engine = f"{type(self.trainer.model).__name__} ZeRO-{self.trainer.model.zero_optimization_stage()}"

        def training_step(self, batch, _index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(self.all_gather(loss.detach()).mean().item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=ACC_LR)

    return Regression()


def plain_losses(ctx, device):
    """The same ACC_STEPS steps in plain torch, each on the step's whole global batch."""
    torch = ctx.torch
    x, y = regression_data(torch, ctx.world_size)
    model = small_model(torch).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=ACC_LR)
    rows, losses = ACC_MICRO_BATCH * ctx.world_size, []
    for step in range(ACC_STEPS):
        window = slice(rows * step, rows * (step + 1))
        loss = torch.nn.functional.mse_loss(model(x[window].to(device)), y[window].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ACC_CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_through_lightning(ctx, pl, strategy_class, stage, on_cpu):
    """ACC_STEPS steps through `Trainer.fit` with `DeepSpeedStrategy(stage=…)`; (details, problems). Lightning's
    CPU refusal becomes a SkipCheck naming it."""
    torch = ctx.torch
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or ctx.world_size)
    x, y = regression_data(torch, ctx.world_size)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=ACC_MICRO_BATCH,
                                         sampler=rank_batches(torch, ctx.world_size, ctx.rank))
    module = lightning_module(pl, torch)
    strategy = strategy_class(stage=stage, process_group_backend="gloo" if on_cpu else None)
    with restored_environ():
        trainer = pl.Trainer(accelerator="cpu" if on_cpu else "gpu", devices=local,
                             num_nodes=ctx.world_size // local, strategy=strategy, max_steps=ACC_STEPS,
                             precision="32-true", gradient_clip_val=ACC_CLIP, use_distributed_sampler=False,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        try:
            trainer.fit(module, loader)
        except RuntimeError as exc:
            if CPU_REFUSAL not in str(exc):
                raise
            raise SkipCheck(f"Lightning {pl.__version__} refuses: \"{exc}\" — {REFUSAL_CAUSE}") from None
    device = accelerator().current_device_name()
    ref_losses = plain_losses(ctx, device)
    details = {"losses": [round(v, 6) for v in module.losses], "reference_losses": [round(v, 6) for v in ref_losses],
               "engine": module.engine}
    problems = []
    if module.engine != f"DeepSpeedEngine ZeRO-{stage}":
        problems.append(f"Lightning trained a {module.engine or 'model that never started'}, not a DeepSpeedEngine "
                        f"at ZeRO-{stage}")
    if len(module.losses) != ACC_STEPS:
        problems.append(f"ZeRO-{stage}: {len(module.losses)} steps ran of {ACC_STEPS}")
    for step, (got, want) in enumerate(zip(module.losses, ref_losses, strict=False), start=1):
        if not close(got, want, PL_LOSS_RTOL, PL_LOSS_RTOL):
            problems.append(f"ZeRO-{stage} step {step}: loss {got:.6f}, plain torch {want:.6f}")
            break
    return details, problems


def check_lightning_deepspeed(ctx):
    """Lightning's DeepSpeedStrategy, ZeRO-2 and ZeRO-3: a DeepSpeedEngine of the stage asked for, each step's
    loss that of plain torch on the global batch; on the CPU, Lightning's own refusal as the skip reason."""
    ctx.need_dist()
    pl, strategy_class = import_lightning(ctx.torch)
    on_cpu = accelerator()._name == "cpu"
    details = {"lightning": pl.__version__, "steps": ACC_STEPS, "rtol": PL_LOSS_RTOL}
    return each_zero_stage(details, lambda stage: train_through_lightning(ctx, pl, strategy_class, stage, on_cpu))


CHECKS = (
    Check("lightning_deepspeed", "Lightning's DeepSpeedStrategy, ZeRO-2 and ZeRO-3, matches plain torch step by step "
          "(skipped unless lightning is installed; Lightning allows DeepSpeed only on GPUs)",
          ("deepspeed", "distributed", "pkg:lightning"), check_lightning_deepspeed),
)

"""LoRA-style fine-tuning under ZeRO-3 with activation checkpointing, against the same run in plain torch.

Most DeepSpeed users today fine-tune a frozen base model through small trainable adapters, with activation
checkpointing on. That is where ZeRO-3 has to gather frozen weights again when a checkpointed block is
recomputed in backward, and where DeepSpeed has gone wrong both ways: 0.19.2 failed non-reentrant
checkpointing with torch's CheckpointError, and from 0.19.3 (PR #8148) frozen weights recomputed by a
reentrant checkpoint stay gathered until the whole backward ends, so every block's base weights are in memory
at once, ZeRO-3's saving gone (our patch 0024). So this check trains with both checkpoint kinds and watches,
in every block's backward, how much of the frozen model is gathered; after every step nothing may be.
`lora_zero3_peft` runs the same with peft's own LoRA layers where peft is installed.
"""

from __future__ import annotations

import importlib

from .context import accelerator, close
from .protocol import Check, CheckFailed, SkipCheck
from .training import ADAM, GRADIENT_CLIPPING, LOSS_ATOL, LOSS_RTOL, MICRO_BATCH, compare_curves, global_batch

ADAPTER_RANK, ADAPTER_SCALE = 4, 2.0
ADAPTER_LAYERS, ADAPTER_D_FF = 3, 256  # three blocks: a growing gathered set shows from the second one
ADAPTER_STEPS = 4
ADAPTER_PARAM_ATOL = 1e-5  # adapters after the run vs the plain copy (fp32; measured here ~1e-8)
CHECKPOINT_KINDS = ("non_reentrant", "reentrant")
# Every parameter partitioned, nothing prefetched or kept for reuse: what is gathered is what is in use.
ZERO3_STRICT = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
                "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}


ADAPTED = ("qkv", "proj", "fc1", "fc2")  # every linear layer of a block


def import_peft(torch):
    try:
        return importlib.import_module("peft")
    except ImportError as exc:
        raise SkipCheck(f"peft is not installed in the target ({type(exc).__name__}: {exc}); add it with: "
                        f"PYTHON -m pip install peft torch=={torch.__version__} (torch named so pip keeps it)"
                        ) from None


def checkpointed_forward(torch, model, reentrant):
    """Give the suite's decoder a forward that runs each block under torch.utils.checkpoint of the given kind.
    Reentrant checkpointing needs an input that requires grad, so the frozen embedding's output is made to
    (what peft's enable_input_require_grads does)."""
    from .training import VOCAB  # noqa: PLC0415

    checkpoint = torch.utils.checkpoint.checkpoint

    def forward(tokens, targets):
        x = model.embed(tokens)
        if reentrant:
            x.requires_grad_(True)
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=reentrant)
        logits = model.head(model.ln_f(x)).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    model.forward = forward
    return model


def build_adapter_model(torch, reentrant, peft=None):
    """The suite's decoder shape with frozen base weights and a trainable low-rank adapter (A: d->r, B: r->d,
    B zero at start, as LoRA initialises it) beside every linear layer of every block, under activation
    checkpointing. Plain torch adapters, or peft's LoRA (`get_peft_model`, the same rank and scale) when
    `peft` is given: what most fine-tuning scripts run."""
    from .training import build_model  # noqa: PLC0415

    nn = torch.nn
    model = checkpointed_forward(torch, build_model(torch, d_ff=ADAPTER_D_FF, n_layers=ADAPTER_LAYERS), reentrant)
    if peft is not None:
        config = peft.LoraConfig(r=ADAPTER_RANK, lora_alpha=ADAPTER_RANK * ADAPTER_SCALE, lora_dropout=0.0,
                                 target_modules=list(ADAPTED), bias="none")
        return peft.get_peft_model(model, config)

    class Adapted(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.lora_a = nn.Linear(base.in_features, ADAPTER_RANK, bias=False)
            self.lora_b = nn.Linear(ADAPTER_RANK, base.out_features, bias=False)
            nn.init.zeros_(self.lora_b.weight)

        def forward(self, x):
            return self.base(x) + self.lora_b(self.lora_a(x)) * ADAPTER_SCALE

    for param in model.parameters():
        param.requires_grad_(False)
    for block in model.blocks:
        for name in ADAPTED:
            setattr(block, name, Adapted(getattr(block, name)))
    return model


def decoder_blocks(model):
    """The checkpointed blocks, through peft's wrapper where there is one."""
    return (model.get_base_model() if hasattr(model, "get_base_model") else model).blocks


def adapter_config():
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
            # torch's AdamW: the check is about ZeRO-3's gathering, not an optimizer op
            "optimizer": {"type": "AdamW", "params": {**ADAM, "betas": list(ADAM["betas"]), "torch_adam": True}},
            "zero_optimization": dict(ZERO3_STRICT), "gradient_clipping": GRADIENT_CLIPPING,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


class GatherWatch:
    """In each block's backward (when its first adapter's gradient arrives), how many elements of frozen
    parameters are gathered in the whole model; the most of one block is what a healthy ZeRO-3 holds."""

    def __init__(self, model):
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # noqa: PLC0415

        self.available = ZeroParamStatus.NOT_AVAILABLE
        self.frozen = [p for p in model.parameters() if not p.requires_grad]
        self.seen: list[int] = []
        blocks = decoder_blocks(model)
        self.block_frozen = max(sum(p.ds_numel for p in block.parameters() if not p.requires_grad)
                                for block in blocks)
        # the first trainable parameter of each block: its adapter beside qkv (ours or peft's lora_A)
        self.handles = [next(p for p in block.parameters() if p.requires_grad).register_hook(self.record)
                        for block in blocks]

    def record(self, grad):
        self.seen.append(sum(p.ds_numel for p in self.frozen if p.ds_status != self.available))
        return grad

    def gathered_now(self, model):
        return [name for name, p in model.named_parameters() if p.ds_status != self.available]

    def remove(self):
        for handle in self.handles:
            handle.remove()


def train_adapters(ctx, reentrant, peft=None):
    """One ZeRO-3 run beside its plain copy; (details, problems)."""
    torch, deepspeed = ctx.torch, ctx.deepspeed
    device = accelerator().current_device_name()
    torch.manual_seed(2024)
    model = build_adapter_model(torch, reentrant, peft)
    reference = build_adapter_model(torch, reentrant, peft).to(device)
    reference.load_state_dict(model.state_dict())
    trainable = [p for p in reference.parameters() if p.requires_grad]
    ref_optimizer = torch.optim.AdamW(trainable, **ADAM)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=adapter_config())
    watch = GatherWatch(engine.module)
    x, y = global_batch(torch, ctx.world_size, device)
    rows = slice(ctx.rank * MICRO_BATCH, (ctx.rank + 1) * MICRO_BATCH)
    losses, ref_losses, per_step, problems = [], [], [], []
    try:
        for step in range(1, ADAPTER_STEPS + 1):
            watch.seen.clear()
            loss = engine(x[rows].to(engine.device), y[rows].to(engine.device))
            engine.backward(loss)
            engine.step()
            value = loss.detach().float().reshape(1)
            torch.distributed.all_reduce(value)
            losses.append(value.item() / ctx.world_size)
            per_step.append(max(watch.seen, default=0))
            left = watch.gathered_now(engine.module)
            if left and not problems:
                problems.append(f"after step {step}, {len(left)} parameter(s) still gathered (first: {left[0]})")
            ref_optimizer.zero_grad()
            ref_loss = reference(x, y)
            ref_loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, GRADIENT_CLIPPING)
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        adapters = [p for p in engine.module.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(adapters):
            worst = max(float((p.detach().float().cpu() - q.detach().float().cpu()).abs().max())
                        for p, q in zip(adapters, trainable, strict=True))
    finally:
        watch.remove()
        engine.destroy()
    details = {"losses": [round(v, 6) for v in losses], "reference_losses": [round(v, 6) for v in ref_losses],
               "frozen_gathered_in_backward": per_step, "one_block_frozen": watch.block_frozen,
               "adapter_max_abs_diff": worst}
    deviation = compare_curves(losses, ref_losses, LOSS_RTOL)
    if deviation:
        problems.append(deviation)
    if max(per_step) > watch.block_frozen:
        problems.append(f"in backward, {max(per_step)} elements of frozen parameters were gathered at once, more "
                        f"than one block's {watch.block_frozen}: recomputed frozen weights are kept after their "
                        "block's backward")
    if any(count != per_step[0] for count in per_step):
        problems.append(f"the frozen elements gathered in backward change from step to step: {per_step}")
    if not close(worst, 0.0, 0.0, ADAPTER_PARAM_ATOL):
        problems.append(f"adapters differ from the plain torch run by {worst:.3g} (tolerance {ADAPTER_PARAM_ATOL:g})")
    return details, problems


def adapters_under_zero3(ctx, peft=None):
    """Both checkpoint kinds, each a ZeRO-3 run beside its plain copy; details, or CheckFailed with them."""
    ctx.need_dist()
    details, problems = {"steps": ADAPTER_STEPS, "rank": ADAPTER_RANK, "layers": ADAPTER_LAYERS,
                         "tolerance": {"loss_rtol": LOSS_RTOL, "loss_atol": LOSS_ATOL,
                                       "adapter_atol": ADAPTER_PARAM_ATOL}}, []
    if peft is not None:
        details["peft"] = peft.__version__
    for kind in CHECKPOINT_KINDS:
        found, more = train_adapters(ctx, kind == "reentrant", peft)
        details[kind] = found
        problems += [f"{kind} checkpointing: {problem}" for problem in more]
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def check_lora_zero3(ctx):
    """Frozen base + trainable adapters under ZeRO-3 with non-reentrant and reentrant activation checkpointing:
    the losses and adapters of a plain torch run, no more than one block's frozen weights gathered in backward,
    the same every step, and nothing gathered after a step."""
    return adapters_under_zero3(ctx)


def check_lora_zero3_peft(ctx):
    """The same with peft's LoRA layers (`get_peft_model`) instead of ours: peft's wrapper and module
    replacement under ZeRO-3's hooks, as fine-tuning scripts use them."""
    return adapters_under_zero3(ctx, import_peft(ctx.torch))


CHECKS = (
    Check("lora_zero3", "frozen base + trainable adapters under ZeRO-3 with (non-)reentrant activation "
          "checkpointing: matches plain torch, frozen weights released after each block's backward",
          ("deepspeed", "distributed"), check_lora_zero3),
    Check("lora_zero3_peft", "lora_zero3 with peft's LoRA layers (get_peft_model) instead of plain torch adapters "
          "(skipped unless peft is installed)", ("deepspeed", "distributed", "pkg:peft"), check_lora_zero3_peft),
)

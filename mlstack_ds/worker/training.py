"""The suite's model and the paired run: a DeepSpeed engine beside a plain torch AdamW copy, judged step by step."""

from __future__ import annotations

import contextlib
import copy

from .context import accelerator, close, finite
from .protocol import CheckFailed

# The model and its training run: small enough for 2 CPU cores, large enough that ZeRO-3 partitions
# the MLP weights (numel > stage3_param_persistence_threshold = 1e5) while the small tensors stay
# persistent, which is the configuration the 0.19.5 CPU all-gather race corrupts.
VOCAB, D_MODEL, D_FF, N_LAYERS, N_HEADS, SEQ = 256, 128, 1024, 2, 4, 16
MICRO_BATCH = 4
STEPS = 8
LR = 1e-3
ADAM = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
# DeepSpeed 0.19.5 clips gradients to norm 1.0 unless told otherwise; keep its default (that is what
# users run, and it exercises the distributed gradient-norm under partitioning) and clip the reference
# the same way.
GRADIENT_CLIPPING = 1.0
# DeepSpeed's loss vs the plain torch AdamW copy, per step. Healthy fp32 runs agree to ~1e-5; the
# race shows as NaN, spikes (2e7) or values off by >30 %.
LOSS_RTOL, LOSS_ATOL = 1e-3, 1e-4
LOW_PRECISION_RTOL = 5e-2  # bf16/fp16 against the fp32 reference
OPTIMIZER_STEPS = 10
OPTIMIZER_ATOL = 1e-5


def build_model(torch, *, vocab=VOCAB, d_model=D_MODEL, d_ff=D_FF, n_layers=N_LAYERS, n_heads=N_HEADS):
    """A GPT-like decoder (pre-norm blocks, causal attention, untied head); the suite's shape by default,
    `bench` passes its own."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, d_ff)
            self.fc2 = nn.Linear(d_ff, d_model)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, n_heads, d_model // n_heads).unbind(2)
            att = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d_model))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x)).float()
            return torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    return TinyLM()


def global_batch(torch, world_size, device="cpu"):
    """The same seeded batch on every rank, on `device`; rank r trains on rows [r*MICRO, (r+1)*MICRO).
    Drawn on the CPU and then moved, so every platform trains on the same tokens."""
    gen = torch.Generator().manual_seed(4321)
    tokens = torch.randint(0, VOCAB, (world_size * MICRO_BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def paired_models(torch, device, seed):
    """(model for the engine, its plain copy on `device`, the copy's AdamW). The engine's model is handed to
    deepspeed.initialize where it was built, as users do: DeepSpeed places it (on the device, or partitioned,
    or offloaded); the reference is placed here, beside the engine, so both compute on the same hardware."""
    torch.manual_seed(seed)
    model = build_model(torch)
    reference = copy.deepcopy(model).to(device)
    return model, reference, torch.optim.AdamW(reference.parameters(), **ADAM)


def ds_config(stage, offload_optimizer=False, offload_param=False, precision=None):
    zero = {"stage": stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {**ADAM, "betas": list(ADAM["betas"])}},
        "zero_optimization": zero,
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if precision:
        config[precision] = {"enabled": True}
    return config


class PairedRun:
    """A DeepSpeed engine and a plain torch AdamW copy of the same model, stepped side by side."""

    def __init__(self, ctx, config, seed=1234):
        torch, deepspeed = ctx.torch, ctx.deepspeed
        self.ctx, self.torch = ctx, torch
        device = accelerator().current_device_name()
        model, self.reference, self.ref_optimizer = paired_models(torch, device, seed)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
        ctx.progress("engine")
        x, y = global_batch(torch, ctx.world_size, device)
        rows = slice(ctx.rank * MICRO_BATCH, (ctx.rank + 1) * MICRO_BATCH)
        self.local = (x[rows].to(self.engine.device), y[rows].to(self.engine.device))
        self.full = (x, y)
        self.losses, self.ref_losses = [], []

    def step(self):
        torch = self.torch
        loss = self.engine(*self.local)
        self.engine.backward(loss)
        self.engine.step()
        value = loss.detach().float().reshape(1)  # stays on the device: NCCL/RCCL reduce no CPU tensors
        torch.distributed.all_reduce(value)
        self.losses.append(value.item() / self.ctx.world_size)
        self.ctx.progress("step", step=len(self.losses))  # after the all-reduce: every rank got this far
        self.ref_optimizer.zero_grad()
        ref_loss = self.reference(*self.full)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.reference.parameters(), GRADIENT_CLIPPING)
        self.ref_optimizer.step()
        self.ref_losses.append(ref_loss.item())

    def run(self, steps):
        for _ in range(steps):
            self.step()

    def destroy(self):
        with contextlib.suppress(Exception):
            self.engine.destroy()


def compare_curves(losses, ref_losses, rtol, first_step=1):
    """The first step where the loss is non-finite or leaves the reference's tolerance, or None."""
    for index, (got, want) in enumerate(zip(losses, ref_losses, strict=True)):
        step = first_step + index
        if not finite(got):
            return f"step {step}: loss is {got} (reference {want:.6f})"
        if not close(got, want, rtol, LOSS_ATOL):
            return (f"step {step}: loss {got:.6f} deviates from the torch AdamW reference {want:.6f} "
                    f"(tolerance {LOSS_ATOL:g} + {rtol:g}*|ref|)")
    return None


def is_zero3(params):
    return hasattr(params[0], "ds_id")


def full_parameters(ctx, engine, coalesced=False):
    """Every parameter in full, as float64 CPU copies.

    Under ZeRO-3 each parameter is gathered on its own by default (a single-parameter all-gather),
    which does not go through the coalesced path that 0.19.5 gets wrong on CPU; `coalesced=True`
    gathers them all at once through `GatheredParameters`, as user code saving a model does.
    """
    torch, zero = ctx.torch, ctx.deepspeed.zero
    params = list(engine.module.parameters())
    if not is_zero3(params):
        return [p.detach().to("cpu", torch.float64).clone() for p in params]
    if coalesced:
        with zero.GatheredParameters(params):
            return [p.detach().to("cpu", torch.float64).clone() for p in params]
    copies = []
    for param in params:
        with zero.GatheredParameters([param]):
            copies.append(param.detach().to("cpu", torch.float64).clone())
    return copies


def ranks_agree(ctx, tensors):
    """Do all ranks hold bitwise the same parameters? Compares a checksum vector across ranks."""
    torch = ctx.torch
    local = torch.tensor([float(t.sum()) for t in tensors] + [float(t.abs().sum()) for t in tensors],
                         dtype=torch.float64, device=accelerator().current_device_name())
    gathered = [torch.zeros_like(local) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(gathered, local)
    worst = max(float((g - local).abs().max()) for g in gathered)
    return worst == 0.0, worst  # bitwise: every rank gathered the same bytes


def train_and_judge(ctx, config, steps=STEPS, rtol=LOSS_RTOL, inspect=None):
    """Train beside the reference; fail on the first (most telling) problem found.

    Order of blame: the loss curve (issue 8: names the step), the loss not decreasing, ranks
    disagreeing on the parameters, then what `inspect(trainer)` finds (partitioning, gathers).
    """
    ctx.need_dist()
    trainer = PairedRun(ctx, config)
    try:
        trainer.run(steps)
        details = {"steps": steps, "losses": [round(v, 6) for v in trainer.losses],
                   "reference_losses": [round(v, 6) for v in trainer.ref_losses],
                   "tolerance": {"rtol": rtol, "atol": LOSS_ATOL}}
        problems = []
        deviation = compare_curves(trainer.losses, trainer.ref_losses, rtol)
        if deviation:
            problems.append(deviation)
        elif not trainer.losses[-1] < trainer.losses[0]:
            problems.append(f"loss did not decrease over {steps} steps "
                            f"({trainer.losses[0]:.6f} -> {trainer.losses[-1]:.6f})")
        agree, worst = ranks_agree(ctx, full_parameters(ctx, trainer.engine))
        details["ranks_agree"] = agree
        if not agree:
            problems.append(f"ranks hold different parameters after training (max checksum difference "
                            f"{worst:g})")
        if inspect:
            found, more = inspect(trainer)
            details.update(found)
            problems += more
        if problems:
            raise CheckFailed("; ".join(problems), details)
        return details
    finally:
        trainer.destroy()


def partition_details(ctx, stage):
    """How much of the model each rank holds: optimizer state (all stages), parameters (stage 3)."""

    def inspect(trainer):
        engine, n, torch = trainer.engine, ctx.world_size, ctx.torch
        params = list(engine.module.parameters())
        total = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        state_numel = sum(s["exp_avg"].numel() for s in inner.state.values() if "exp_avg" in s)
        share = state_numel / total
        details = {"model_numel": total, "optimizer_state_numel_this_rank": state_numel,
                   "optimizer_state_share": round(share, 4), "expected_share": round(1 / n, 4)}
        problems = []
        # Padding puts a rank's share a little above 1/N; no partitioning would make it 1.0.
        if not (0.5 / n <= share <= 1.0 / n + 0.05):
            problems.append(f"optimizer state not partitioned: this rank holds {share:.3f} of it, "
                            f"expected ~{1 / n:.3f}")
        if stage != 3:
            return details, problems
        shard = sum(p.ds_tensor.numel() for p in params)
        partitioned = [p for p in params if not getattr(p, "ds_persist", False)]
        resident = sum(p.data.numel() for p in partitioned)
        details.update(param_shard_numel_this_rank=shard, param_share=round(shard / total, 4),
                       partitioned_params=len(partitioned), persistent_params=len(params) - len(partitioned),
                       resident_numel_of_partitioned_params=resident)
        if not (0.5 / n <= shard / total <= 1.0 / n + 0.05):
            problems.append(f"ZeRO-3 parameters not partitioned: this rank's shards hold "
                            f"{shard / total:.3f} of the model, expected ~{1 / n:.3f}")
        if not partitioned or resident != 0:
            problems.append(f"ZeRO-3 parameters stay gathered outside forward ({resident} elements resident)")
        one_by_one = full_parameters(ctx, engine)
        all_at_once = full_parameters(ctx, engine, coalesced=True)
        wrong = sum(1 for a, b in zip(one_by_one, all_at_once, strict=True) if not torch.equal(a, b))
        details["coalesced_gather_mismatches"] = wrong
        if wrong:
            problems.append(f"GatheredParameters over all parameters (one coalesced all-gather) returned "
                            f"wrong values for {wrong} of {len(params)}, while gathering them one by one "
                            "is right: the 0.19.5 coalesced all-gather race (waits on the last handle "
                            "only; fixed upstream by PR #8539)")
        return details, problems

    return inspect

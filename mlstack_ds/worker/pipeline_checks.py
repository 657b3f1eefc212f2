"""Pipeline parallelism and activation checkpointing, each against a plain torch run of the same layers.

The pipeline is the suite's model cut into four layers (embedding, two blocks, final norm + head) and split
into stages by `pipeline_layout`; beside it a plain copy of the whole model trains with torch AdamW on the
same global batch. A rank that fails inside a pipeline schedule leaves its peer waiting in a send or
receive until the launch time-out, so `activation_checkpointing` first runs the parts that need no peer on
every rank and starts its pipeline only when all ranks agree those passed.
"""

from __future__ import annotations

import contextlib
import copy
import traceback

from .context import accelerator, close, finite
from .protocol import Check, CheckFailed, SkipCheck
from .training import ADAM, GRADIENT_CLIPPING, LR, SEQ, VOCAB, build_model

PIPELINE_LAYERS = 4  # embedding, block, block, final norm + head
PIPELINE_STEPS = 4
PIPELINE_MICRO_BATCH = 2
PIPELINE_MICRO_BATCHES = 2  # gradient accumulation steps: the schedule interleaves micro-batches
# fp32 pipeline vs the plain torch copy: only the summation order differs (micro-batches accumulated, the
# gradient norm summed over stages). Measured here (ZeRO-1, 2 stages, CPU): losses within 5e-7 of torch.
PIPELINE_LOSS_RTOL, PIPELINE_LOSS_ATOL = 1e-6, 1e-6
# Parameters are compared coarsely: AdamW turns gradient roundoff into full-size steps where the exact
# gradient is zero (the attention key bias: softmax ignores it), so those differ by ~3e-5 after 4 steps while
# every weight matrix agrees within 6e-6. One step's largest AdamW move (lr) still catches a stage that did
# not step, or stepped on wrong gradients.
PIPELINE_PARAM_ATOL = LR
# ZeRO-1, not ZeRO-0: with ZeRO-0 (fp32) DeepSpeed 0.19.5 clips pipeline gradients by the first stage's
# gradient norm alone (runtime/utils.clip_grad_norm_ counts unmarked parameters only where
# mpu.get_model_parallel_rank() is 0, and a pipeline grid numbers its stages there), so it does not clip as
# torch's clip_grad_norm_ over the whole model does; ZeRO-1 asks for the tensor-parallel rank and does.
PIPELINE_ZERO_STAGE = 1
# Recomputing a block in backward runs the same kernels on the same inputs (and DeepSpeed restores the RNG
# state, so dropout draws the same mask): the output and gradients match the plain run's bitwise, on the CPU and
# on an H100 (measured, issue 39). A GPU need not promise that: an attention backward that accumulates with
# atomics sums in another order each run. The bound is relative to each tensor's largest element: the fp32 sum
# of the <= 4*16*128 terms this block adds up moves by at most n*2^-24 (~5e-4) of its magnitude in another
# order, typically sqrt(n)*2^-24 (~5e-6); a wrong recomputation (another dropout mask, a stale input) is off by
# the tensor's whole size, 1.
CHECKPOINT_GRAD_RTOL = 1e-4
CHECKPOINT_DROPOUT = 0.1
STREAM_BUG = ("DeepSpeed's activation checkpointing asks the accelerator for a stream it does not have "
              "(fixed upstream in PR #8611, DeepSpeed 0.19.8; mlstack-ds patch 0005)")
# Module-level state of deepspeed/runtime/activation_checkpointing/checkpointing.py that configure(),
# checkpoint() and the pipeline engine read or write; saved before and restored after each use.
CHECKPOINTING_GLOBALS = ("mpu", "num_layers", "deepspeed_checkpointing_enabled", "mp_rank", "mp_size", "mp_group",
                         "PARTITION_ACTIVATIONS", "CPU_CHECKPOINT", "CONTIGUOUS_CHECKPOINTING", "SYNCHRONIZE",
                         "PROFILE_TIME", "timers", "contiguous_data_buffers", "data_offsets",
                         "contiguous_size_buffers", "size_offsets")


def pipeline_layout(world_size, layers=PIPELINE_LAYERS):
    """(stages, data-parallel replicas) for the suite's pipeline, or None when it cannot be split.

    Two stages where the world is even (the rest is data parallel: 4 ranks = 2 stages x 2 replicas);
    an odd world uses its smallest prime factor as the stage count (3 ranks = 3 stages), as long as every
    stage gets a layer.
    """
    if world_size < 2:
        return None
    stages = next(p for p in range(2, world_size + 1) if world_size % p == 0)
    if stages > layers:
        return None
    return stages, world_size // stages


def layout_or_skip(ctx):
    layout = pipeline_layout(ctx.world_size)
    if layout is None:
        if ctx.world_size < 2:
            raise SkipCheck("a pipeline needs at least 2 ranks (one per stage); this run has 1")
        raise SkipCheck(f"{ctx.world_size} ranks cannot be split into 2..{PIPELINE_LAYERS} equal pipeline stages "
                        f"of this {PIPELINE_LAYERS}-layer model")
    return layout


def pipeline_config():
    return {
        "train_micro_batch_size_per_gpu": PIPELINE_MICRO_BATCH,
        "gradient_accumulation_steps": PIPELINE_MICRO_BATCHES,
        "optimizer": {"type": "AdamW", "params": {**ADAM, "betas": list(ADAM["betas"])}},
        "zero_optimization": {"stage": PIPELINE_ZERO_STAGE},
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def pipeline_batches(torch, replicas, device="cpu"):
    """One seeded global batch per step, on `device` (drawn on the CPU: the same tokens on every platform):
    replica d's micro-batch m is rows ((d*M + m)*B, +B)."""
    rows = replicas * PIPELINE_MICRO_BATCHES * PIPELINE_MICRO_BATCH
    gen = torch.Generator().manual_seed(2468)
    batches = []
    for _ in range(PIPELINE_STEPS):
        tokens = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=gen)
        batches.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return batches


def split_layers(torch, model):
    """The suite's model as a sequence of single-input layers (they share the model's parameters)."""
    return [model.embed, model.blocks[0], model.blocks[1], torch.nn.Sequential(model.ln_f, model.head)]


def run_pipeline(ctx, checkpoint_interval=0):
    """Train the pipeline beside a plain torch copy; details, or CheckFailed naming the first problem.

    The pipeline engine hands its topology to `deepspeed.utils.groups` as the process-wide `mpu`, and
    `destroy()` does not take it back (0.19.5): a later engine in the same process (the HF Trainer's
    ZeRO-2 in this suite) then reduces gradients over the pipeline's data-parallel group, one rank here,
    and each rank silently trains alone. Seen as hf_trainer's ZeRO-2 run 0.85 of a step away from the
    plain Trainer after this check; so the previous `mpu` is put back."""
    ctx.need_deepspeed()
    from deepspeed.utils import groups  # noqa: PLC0415

    saved_mpu = groups.mpu
    try:
        return train_pipeline(ctx, checkpoint_interval)
    finally:
        groups.mpu = saved_mpu


def train_pipeline(ctx, checkpoint_interval):
    ctx.need_dist()
    torch, deepspeed = ctx.torch, ctx.deepspeed
    from deepspeed.pipe import PipelineModule  # noqa: PLC0415

    stages, replicas = layout_or_skip(ctx)
    torch.manual_seed(1234)
    model = build_model(torch)
    device = accelerator().current_device_name()
    reference = copy.deepcopy(model).to(device)  # beside the stages, on the same hardware
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **ADAM)

    def loss_fn(logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    # Only the blocks are checkpointed: DeepSpeed's (reentrant) checkpoint gives no gradient to a layer
    # whose inputs need none, which is the embedding's case (upstream excludes it for its GPT models only).
    module = PipelineModule(layers=split_layers(torch, model), num_stages=stages, loss_fn=loss_fn,
                            partition_method="uniform", activation_checkpoint_interval=checkpoint_interval,
                            checkpointable_layers=["Block"])
    checkpointed = count_calls(module)
    engine, *_ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()],
                                      config=pipeline_config())
    try:
        replica = engine.grid.data_parallel_id
        losses, ref_losses = [], []
        for tokens, targets in pipeline_batches(torch, replicas, device):
            micro = [(tokens[r:r + PIPELINE_MICRO_BATCH].to(device), targets[r:r + PIPELINE_MICRO_BATCH].to(device))
                     for r in range((replica * PIPELINE_MICRO_BATCHES) * PIPELINE_MICRO_BATCH,
                                    (replica + 1) * PIPELINE_MICRO_BATCHES * PIPELINE_MICRO_BATCH,
                                    PIPELINE_MICRO_BATCH)]
            losses.append(float(engine.train_batch(data_iter=iter(micro))))
            ref_optimizer.zero_grad()
            ref_loss = reference(tokens, targets)
            ref_loss.backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), GRADIENT_CLIPPING)
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        worst = stage_param_diff(ctx, module, split_layers(torch, reference))
        details = {"stages": stages, "data_parallel": replicas, "stage_of_this_rank": engine.stage_id,
                   "micro_batches": PIPELINE_MICRO_BATCHES, "micro_batch_size": PIPELINE_MICRO_BATCH,
                   "activation_checkpoint_interval": checkpoint_interval, "steps": PIPELINE_STEPS,
                   "losses": [round(v, 7) for v in losses], "reference_losses": [round(v, 7) for v in ref_losses],
                   "max_param_abs_diff": worst, "lr": LR,
                   "tolerance": {"loss_rtol": PIPELINE_LOSS_RTOL, "loss_atol": PIPELINE_LOSS_ATOL,
                                 "param_atol": PIPELINE_PARAM_ATOL}}
        details.update(zero_stage=PIPELINE_ZERO_STAGE, checkpointed_calls_this_rank=checkpointed[0])
        problems = []
        # a stage holding only the embedding or the head has nothing to checkpoint (3 stages: 1 layer each)
        if checkpoint_interval and any(module.is_checkpointable_results) and not checkpointed[0]:
            problems.append(f"activation_checkpoint_interval={checkpoint_interval} but this stage checkpointed "
                            "none of its blocks")
        for step, (got, want) in enumerate(zip(losses, ref_losses, strict=True), start=1):
            if not finite(got) or not close(got, want, PIPELINE_LOSS_RTOL, PIPELINE_LOSS_ATOL):
                problems.append(f"step {step}: pipeline loss {got:.7f} vs torch {want:.7f} (tolerance "
                                f"{PIPELINE_LOSS_ATOL:g} + {PIPELINE_LOSS_RTOL:g}*|ref|)")
                break
        if not worst <= PIPELINE_PARAM_ATOL:
            problems.append(f"after {PIPELINE_STEPS} steps the stages' parameters differ from the torch copy's by "
                            f"up to {worst:g} (tolerance {PIPELINE_PARAM_ATOL:g})")
        if problems:
            raise CheckFailed("; ".join(problems), details)
        return details
    finally:
        with contextlib.suppress(Exception):
            engine.destroy()


def count_calls(module):
    """Count the pipeline's calls of its activation checkpoint function (proof the interval took effect)."""
    calls = [0]
    inner = module.activation_checkpoint_func

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    module.activation_checkpoint_func = counted
    return calls


def stage_param_diff(ctx, module, ref_layers):
    """Largest |pipeline - torch| over every stage's parameters, agreed across ranks (all-reduce max)."""
    torch = ctx.torch
    worst = 0.0
    for name, layer in module.named_children():
        if not name.isdigit():
            continue
        ref = ref_layers[int(name)]
        for got, want in zip(layer.parameters(), ref.parameters(), strict=True):
            worst = max(worst, float((got.detach().cpu().double() - want.detach().cpu().double()).abs().max()))
    value = torch.tensor([worst], dtype=torch.float64, device=module_device(module))
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return float(value.item())


def module_device(module):
    return next(module.parameters()).device


def check_pipeline(ctx):
    return run_pipeline(ctx)


@contextlib.contextmanager
def checkpointing_configured(ctx):
    """DeepSpeed's activation checkpointing configured to its defaults, and its module state put back after."""
    from deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: PLC0415

    saved = {name: getattr(checkpointing, name) for name in CHECKPOINTING_GLOBALS if hasattr(checkpointing, name)}
    try:
        ctx.deepspeed.checkpointing.configure(None, partition_activations=False, contiguous_checkpointing=False,
                                              checkpoint_in_cpu=False, synchronize=False, profile=False)
        yield ctx.deepspeed.checkpointing
    finally:
        for name, value in saved.items():
            setattr(checkpointing, name, value)
        with contextlib.suppress(Exception):
            checkpointing.reset()


def checkpoint_gradients(ctx, apply, device):
    """Output and gradients (inputs, then parameters) of a block with dropout, run through `apply(fn, x)`,
    with the block, its input and the loss weights on `device` (DeepSpeed's checkpoint runs the block where
    its inputs are: a block left on the CPU beside GPU inputs fails in its first layer norm)."""
    torch = ctx.torch
    torch.manual_seed(4321)
    block = build_model(torch).blocks[0].to(device)
    gen = torch.Generator().manual_seed(8765)
    x = torch.randn(4, SEQ, block.fc1.in_features, generator=gen).to(device).requires_grad_(True)
    weight = torch.randn(4, SEQ, block.fc1.in_features, generator=gen).to(device)

    def fn(inputs):
        return torch.nn.functional.dropout(block(inputs), p=CHECKPOINT_DROPOUT, training=True)

    torch.manual_seed(99)  # the dropout mask; recomputation must draw the same one
    out = apply(fn, x)
    (out * weight).sum().backward()
    return [out.detach()] + [x.grad] + [p.grad for p in block.parameters()]


def compare_gradients(plain, other):
    """(largest |difference|, largest |difference| relative to its tensor's largest |element|, tensors that
    differ at all) between the plain run's output and gradients and another run's."""
    worst, relative, differing = 0.0, 0.0, 0
    for a, b in zip(plain, other, strict=True):
        if b is None or a.shape != b.shape:
            return float("inf"), float("inf"), len(plain)
        diff = float((a - b).abs().max())
        worst = max(worst, diff)
        relative = max(relative, diff / max(float(a.abs().max()), 1e-30))
        differing += diff > 0
    return worst, relative, differing


def checkpoint_functions_agree(ctx):
    """Part (a): deepspeed.checkpointing.checkpoint and non_reentrant_checkpoint vs the plain run, per rank."""
    device = accelerator().current_device_name()
    plain = checkpoint_gradients(ctx, lambda fn, x: fn(x), device)
    results, problems = {}, []
    with checkpointing_configured(ctx) as ds_checkpointing:
        for label, func in (("checkpoint", ds_checkpointing.checkpoint),
                            ("non_reentrant_checkpoint", ds_checkpointing.non_reentrant_checkpoint)):
            try:
                got = checkpoint_gradients(ctx, func, device)
            except Exception as exc:
                problems.append(describe_failure(label, exc))
                continue
            worst, relative, differing = compare_gradients(plain, got)
            results[label] = {"max_abs_diff": worst, "max_relative_diff": relative, "tensors_differing": differing,
                              "tensors": len(plain), "device": str(got[0].device)}
            if not relative <= CHECKPOINT_GRAD_RTOL:
                problems.append(f"deepspeed.checkpointing.{label}: output/gradients differ from the plain run by "
                                f"up to {relative:.3g} of a tensor's largest element (|diff| {worst:g}) in "
                                f"{differing} of {len(plain)} tensors (tolerance {CHECKPOINT_GRAD_RTOL:g})")
    return results, problems


def describe_failure(label, exc):
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    if (isinstance(exc, TypeError) and last is not None and last.filename.endswith("checkpointing.py")
            and "Stream(" in (last.line or "")):
        return f"deepspeed.checkpointing.{label}: {STREAM_BUG}: {type(exc).__name__}: {exc} at {last.line.strip()}"
    where = f" ({last.filename}:{last.lineno})" if last is not None else ""
    return f"deepspeed.checkpointing.{label}: {type(exc).__name__}: {exc}{where}"


def check_activation_checkpointing(ctx):
    ctx.need_dist()
    torch = ctx.torch
    results, problems = checkpoint_functions_agree(ctx)
    # Agree before the pipeline part: a rank failing inside a pipeline schedule would leave its peer
    # waiting for a tensor until the launch time-out.
    everyone = [None] * ctx.world_size
    torch.distributed.all_gather_object(everyone, problems)
    failed = {rank: found for rank, found in enumerate(everyone) if found}
    details = {"functions": results, "relative_tolerance": CHECKPOINT_GRAD_RTOL}
    if failed:
        details["failed_ranks"] = sorted(failed)
        if problems:
            raise CheckFailed("; ".join(problems) + " (pipeline part not run)", details)
        rank = min(failed)
        raise CheckFailed(f"rank {rank}: " + "; ".join(failed[rank]) + " (pipeline part not run)", details)
    if pipeline_layout(ctx.world_size) is None:
        details["pipeline"] = f"not run: {ctx.world_size} rank(s) cannot form the pipeline"
        return details
    with checkpointing_configured(ctx):
        try:
            details["pipeline"] = run_pipeline(ctx, checkpoint_interval=1)
        except CheckFailed as exc:
            raise CheckFailed(f"pipeline with activation_checkpoint_interval=1: {exc}",
                              {**details, "pipeline": exc.details}) from exc
        except Exception as exc:
            raise CheckFailed(f"pipeline with activation_checkpoint_interval=1: "
                              f"{describe_failure('checkpoint', exc)}", details) from exc
    return details


CHECKS = (
    Check("pipeline", "2-stage PipelineModule (train_batch, micro-batches) matches a torch AdamW copy",
          ("deepspeed", "distributed"), check_pipeline),
    Check("activation_checkpointing", "deepspeed.checkpointing gradients equal the plain run's; checkpointed "
          "pipeline matches torch", ("deepspeed", "distributed"), check_activation_checkpointing),
)

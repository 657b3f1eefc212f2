"""Hugging Face Trainer on the installed DeepSpeed: the way most users reach DeepSpeed.

A tiny randomly initialised GPT-2 is trained by a Trainer with ZeRO-2 and ZeRO-3 configs written the
way the transformers DeepSpeed guide writes them (batch sizes, optimizer, scheduler, clipping and
bucket sizes left "auto" for the Trainer to fill), and by a plain Trainer (DDP, no DeepSpeed) on the
same data, seed and learning-rate schedule. Per-step losses and final parameters must agree.

All three Trainers run in the worker's shared process, on the process group it already set up, so
the check undoes what transformers and accelerate leave behind (their state singletons, the global
DeepSpeed-config weak reference, environment variables, log verbosity) for the checks after it.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time

from .context import accelerator, finite
from .protocol import Check, CheckFailed, SkipCheck
from .training import full_parameters

# Nothing may be downloaded: the model is built from a config, there is no tokenizer, and the hub is
# told to stay offline in case anything asks.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false"}
# Dropout off: the runs must be comparable step by step, whatever RNG draws each framework makes.
GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 64,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
SEQ = 32
MICRO_BATCH = 4
STEPS = 6
LR = 1e-2  # large enough that the loss visibly falls within the steps, so a wrong update shows
SEED = 2024
# WarmupLR with "auto" gets warmup_num_steps = max(1, 0) from the Trainer, which DeepSpeed raises to
# 2: the first two optimizer steps run at lr 0, then the full lr. The plain Trainer is given exactly
# that schedule, so the comparison is of the training and not of two schedulers.
ZERO_LR_STEPS = 2
# Per-step loss (the Trainer's logged mean over ranks) against the plain Trainer's; measured here
# within 1e-6 of it.
HF_LOSS_RTOL, HF_LOSS_ATOL = 1e-4, 1e-6
# Final parameters: the distance between the DeepSpeed and the plain run's parameters, relative to how
# far the plain run moved them. Not an elementwise bound: Adam turns the rounding noise of
# gradients that are zero in exact arithmetic (the attention's key bias) into lr-sized steps on
# those few elements, while a real error moves the whole model (relative distance ~1).
HF_PARAM_RTOL = 1e-3  # measured here: ~1.7e-5
MISSING = "transformers is not installed in the target"


def missing_reason(torch, exc):
    """The skip's reason with the one command that adds the check: torch named at its installed version
    keeps pip from replacing it (accelerate depends on torch; an unpinned one is a multi-GB CUDA build)."""
    return (f"{MISSING} ({type(exc).__name__}: {exc}); add it with: {sys.executable} -m pip install "
            f"transformers accelerate torch=={torch.__version__} (torch named so pip keeps it; "
            "scripts/install_deepspeed.sh --with-clients does the same)")


def hf_ds_config(stage):
    """A ZeRO-2/ZeRO-3 config of the kind the transformers DeepSpeed guide shows, "auto" where it uses it."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"}
    if stage == 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=2e8, reduce_scatter=True)
    else:
        zero.update(sub_group_size=1e9, stage3_prefetch_bucket_size="auto",
                    stage3_param_persistence_threshold="auto", stage3_max_live_parameters=1e9,
                    stage3_max_reuse_distance=1e9, stage3_gather_16bit_weights_on_model_save=True)
    return {
        "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 10**9,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "wall_clock_breakdown": False,
    }


def auto_left(value, path=""):
    """Config keys still "auto" after the Trainer filled the config (there should be none)."""
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in auto_left(item, f"{path}{key}.")]
    return [path.rstrip(".")] if value == "auto" else []


def filled_values(config):
    """The values the Trainer put in for the "auto" keys that matter to the comparison."""
    zero = config.get("zero_optimization", {})
    return {"train_batch_size": config.get("train_batch_size"),
            "train_micro_batch_size_per_gpu": config.get("train_micro_batch_size_per_gpu"),
            "gradient_accumulation_steps": config.get("gradient_accumulation_steps"),
            "gradient_clipping": config.get("gradient_clipping"),
            "optimizer": config.get("optimizer", {}).get("params"),
            "scheduler": config.get("scheduler", {}).get("params"),
            **{k: v for k, v in zero.items() if k == "reduce_bucket_size" or k.startswith("stage3_p")}}


@contextlib.contextmanager
def restored_environ():
    """os.environ as it was, on the way out (keys added are removed, changed ones put back)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextlib.contextmanager
def hf_process_state(hf):
    """Undo, on the way out, what a Trainer leaves in the process: environment variables (accelerate
    sets ACCELERATE_USE_DEEPSPEED and never unsets it, which would turn the next plain Trainer into a
    DeepSpeed one), accelerate's singletons, transformers' global DeepSpeed-config reference, its log
    verbosity and torch's thread count (accelerate sets it on CPU when OMP_NUM_THREADS is unset)."""
    torch = hf["torch"]
    threads, verbosity = torch.get_num_threads(), hf["logging"].get_verbosity()
    try:
        with restored_environ():
            yield
    finally:
        hf["unset_hf_deepspeed_config"]()
        hf["AcceleratorState"]._reset_state(reset_partial_state=True)
        hf["GradientState"]._reset_state()
        hf["logging"].set_verbosity(verbosity)
        torch.set_num_threads(threads)


def import_hf(torch):
    """transformers and accelerate, imported once per process; the import (seconds) is timed."""
    started = time.monotonic()
    os.environ.update(OFFLINE_ENV)  # read by huggingface_hub at import time
    try:
        transformers = importlib.import_module("transformers")
        importlib.import_module("accelerate")
        from accelerate.state import AcceleratorState, GradientState  # noqa: PLC0415
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config  # noqa: PLC0415
        # transformers resolves its names lazily: touch the ones used so their import is timed here
        names = {n: getattr(transformers, n) for n in ("Trainer", "TrainingArguments", "GPT2Config",
                                                         "GPT2LMHeadModel")}
    except ImportError as exc:
        raise SkipCheck(missing_reason(torch, exc)) from None
    return {"torch": torch, "version": transformers.__version__, "logging": transformers.utils.logging,
            "AcceleratorState": AcceleratorState, "GradientState": GradientState,
            "unset_hf_deepspeed_config": unset_hf_deepspeed_config, **names,
            "import_s": round(time.monotonic() - started, 2)}


def synthetic_data(torch, world_size):
    """The same seeded rows on every rank (the Trainer's sampler gives each rank its share): arithmetic
    sequences of tokens, which the model can start to learn within a few steps."""
    gen = torch.Generator().manual_seed(SEED)
    rows = STEPS * MICRO_BATCH * world_size
    start = torch.randint(0, GPT2["vocab_size"], (rows, 1), generator=gen)
    stride = torch.randint(1, 8, (rows, 1), generator=gen)
    tokens = (start + stride * torch.arange(SEQ)) % GPT2["vocab_size"]
    return [{"input_ids": row, "labels": row.clone()} for row in tokens]


def initial_model(hf):
    """The same randomly initialised GPT-2 every time (built before any TrainingArguments puts a
    ZeRO-3 config in place, so never under zero.Init: DeepSpeed partitions it at initialize)."""
    hf["torch"].manual_seed(SEED)
    return hf["GPT2LMHeadModel"](hf["GPT2Config"](**GPT2))


def train_one(ctx, hf, name, stage, data):
    """One Trainer run; stage None is the plain Trainer. Returns what the comparison needs."""
    torch = hf["torch"]
    # On a CPU host accelerate counts the processes only when told `use_cpu` (as users must tell it
    # there); without it it sees one process and the "auto" train_batch_size comes out wrong
    # (4 != 4 * 1 * 2). With it, the plain Trainer gets gloo DDP, and the DeepSpeed plugin still makes
    # the DeepSpeed runs DeepSpeed ones. On GPUs it must stay off.
    on_cpu = accelerator()._name == "cpu"
    model = initial_model(hf)
    args = hf["TrainingArguments"](
        output_dir=str(ctx.out_dir / "hf_trainer" / name), max_steps=STEPS, per_device_train_batch_size=MICRO_BATCH,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        logging_strategy="steps", logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, log_level="error", log_level_replica="error", seed=SEED, data_seed=SEED,
        dataloader_num_workers=0, dataloader_pin_memory=False, use_cpu=on_cpu,
        deepspeed=hf_ds_config(stage) if stage else None)
    optimizers = (None, None)
    if stage is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(args.adam_beta1, args.adam_beta2),
                                      eps=args.adam_epsilon, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0 if step < ZERO_LR_STEPS else 1.0)
        optimizers = (optimizer, schedule)
    trainer = hf["Trainer"](model=model, args=args, train_dataset=data, optimizers=optimizers)
    engine = None
    try:
        trainer.train()
        logs = [e for e in trainer.state.log_history if "loss" in e]
        run = {"losses": [e["loss"] for e in logs], "lrs": [e.get("learning_rate") for e in logs],
               "world_size": args.world_size, "distributed_type": str(trainer.accelerator.distributed_type)}
        if stage:
            engine = trainer.model_wrapped
            run["engine"] = type(engine).__name__
            run["zero_stage"] = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None
            run["auto_left"] = auto_left(args.hf_deepspeed_config.config)
            run["filled"] = filled_values(args.hf_deepspeed_config.config)
            run["params"] = full_parameters(ctx, engine)
        else:
            run["params"] = [p.detach().to("cpu", torch.float64).clone() for p in trainer.model.parameters()]
        return run
    finally:
        # No gc.collect() here (nor accelerate's free_memory, which runs one): with torch, DeepSpeed and
        # transformers loaded a full collection costs about a second, and the Trainer already runs one
        # at the start of every train().
        if engine is not None and hasattr(engine, "destroy"):
            with contextlib.suppress(Exception):
                engine.destroy()
        del trainer, model


def param_distance(params, reference, initial):
    """|params - reference| / |reference - initial| over the whole model, and the largest elementwise gap."""
    gap = math.sqrt(sum(float((a - b).square().sum()) for a, b in zip(params, reference, strict=True)))
    moved = math.sqrt(sum(float((b - c).square().sum()) for b, c in zip(reference, initial, strict=True)))
    largest = max(float((a - b).abs().max()) for a, b in zip(params, reference, strict=True))
    return (gap / moved if moved else math.inf), largest


def judge(name, stage, runs, initial, world_size):
    """What is wrong with one DeepSpeed run against the plain Trainer's, and how far apart they are."""
    run, plain = runs[name], runs["plain"]
    problems, measured = [], {}
    if run["engine"] != "DeepSpeedEngine" or run["zero_stage"] != stage:
        problems.append(f"{name}: the Trainer did not train through a ZeRO-{stage} DeepSpeedEngine "
                        f"(got {run['engine']}, stage {run['zero_stage']})")
    if run["world_size"] != world_size:
        problems.append(f"{name}: the Trainer saw world size {run['world_size']}, the process group has {world_size}")
    if run["auto_left"]:
        problems.append(f"{name}: the Trainer left \"auto\" in the DeepSpeed config: {', '.join(run['auto_left'])}")
    filled = run["filled"]
    if filled["train_batch_size"] != MICRO_BATCH * world_size or (filled["optimizer"] or {}).get("lr") != LR:
        problems.append(f"{name}: the Trainer filled \"auto\" wrongly: {filled}")
    losses, reference = run["losses"], plain["losses"]
    if len(losses) != len(reference) or len(losses) != STEPS:
        problems.append(f"{name}: {len(losses)} logged losses, the plain Trainer {len(reference)}, expected {STEPS}")
        return problems, measured
    measured["max_loss_deviation"] = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), start=1):
        if not finite(got) or abs(got - want) > HF_LOSS_ATOL + HF_LOSS_RTOL * abs(want):
            problems.append(f"{name}: step {step}: loss {got:.6f} deviates from the plain Trainer's {want:.6f} "
                            f"(tolerance {HF_LOSS_ATOL:g} + {HF_LOSS_RTOL:g}*|ref|)")
            break
    relative, largest = param_distance(run["params"], plain["params"], initial)
    measured.update(param_relative_distance=relative, max_param_deviation=largest)
    if not relative <= HF_PARAM_RTOL:
        problems.append(f"{name}: final parameters are {relative:.3g} of the plain run's own movement away from "
                        f"the plain Trainer's (tolerance {HF_PARAM_RTOL:g}; largest element gap {largest:.3g})")
    return problems, measured


def check_hf_trainer(ctx):
    ctx.need_deepspeed()
    started = time.monotonic()
    with restored_environ():
        hf = import_hf(ctx.torch)  # a target without transformers skips, whatever else is wrong with it
        ctx.need_dist()
        data = synthetic_data(ctx.torch, ctx.world_size)
        initial = [p.detach().to(dtype=ctx.torch.float64).clone() for p in initial_model(hf).parameters()]
        runs = {}
        for name, stage in (("zero2", 2), ("zero3", 3), ("plain", None)):
            run_started = time.monotonic()
            with hf_process_state(hf):
                runs[name] = train_one(ctx, hf, name, stage, data)
            runs[name]["run_s"] = round(time.monotonic() - run_started, 2)
    plain = runs["plain"]
    details = {"transformers": hf["version"], "import_s": hf["import_s"], "steps": STEPS,
               "plain": {"losses": [round(v, 6) for v in plain["losses"]], "lrs": plain["lrs"],
                         "distributed_type": plain["distributed_type"], "run_s": plain["run_s"]},
               "tolerance": {"loss_rtol": HF_LOSS_RTOL, "loss_atol": HF_LOSS_ATOL, "param_rtol": HF_PARAM_RTOL}}
    problems = []
    if "DEEPSPEED" in plain["distributed_type"]:
        problems.append("the plain Trainer ran under DeepSpeed: state of an earlier Trainer leaked into it")
    if plain["world_size"] != ctx.world_size:
        problems.append(f"the plain Trainer saw world size {plain['world_size']}, the process group has "
                        f"{ctx.world_size}")
    if not plain["losses"] or not plain["losses"][-1] < plain["losses"][0]:
        problems.append(f"the plain Trainer's loss did not decrease over {STEPS} steps: {plain['losses']}")
    for name, stage in (("zero2", 2), ("zero3", 3)):
        found, measured = judge(name, stage, runs, initial, ctx.world_size)
        problems += found
        details[name] = {"losses": [round(v, 6) for v in runs[name]["losses"]], "lrs": runs[name]["lrs"],
                         "filled": runs[name]["filled"], "run_s": runs[name]["run_s"], **measured}
    details["train_s"] = round(time.monotonic() - started - hf["import_s"], 2)
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


CHECKS = (
    Check("hf_trainer", "HF Trainer with ZeRO-2/ZeRO-3 \"auto\" configs matches a plain Trainer (tiny GPT-2)",
          ("deepspeed", "distributed", "pkg:transformers"), check_hf_trainer),
)

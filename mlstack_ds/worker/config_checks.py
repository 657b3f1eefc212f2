"""Checks of DeepSpeed's configuration: the surface this tool's patches add, and the user's own config
(`verify --config FILE`: the suite's model trained under it against the torch reference)."""

from __future__ import annotations

import copy
import json

from .protocol import Check, CheckFailed, SkipCheck
from .training import (
    ADAM,
    D_MODEL,
    GRADIENT_CLIPPING,
    LOSS_RTOL,
    LOW_PRECISION_RTOL,
    MICRO_BATCH,
    partition_details,
    train_and_judge,
)

PRECISIONS = ("bf16", "fp16")


def suite_config(user, bf16_supported=True):
    """The user's config as the suite runs it: ZeRO stage, offload, precision and buckets as given; what the
    comparison with the torch reference needs replaced (the suite's batch, its AdamW without a scheduler,
    its gradient clipping), each replacement named. "auto" values (a Hugging Face config) are what the Trainer
    would fill for the suite's model (buckets from its hidden size) or else DeepSpeed's defaults; an "auto"
    bf16 is on where the accelerator supports it, an "auto" fp16 off.

    Returns (config, replaced, precision): precision is "bf16", "fp16" or None (fp32)."""
    config = copy.deepcopy(user)
    replaced = []
    suite = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
             "optimizer": {"type": "AdamW", "params": {**ADAM, "betas": list(ADAM["betas"])}},
             "gradient_clipping": GRADIENT_CLIPPING}
    for key, value in suite.items():
        if key in config and config[key] != value:
            replaced.append(key)
        config[key] = value
    for key in ("train_batch_size", "scheduler"):
        if config.pop(key, None) is not None:
            replaced.append(key)
    config.update(steps_per_print=10**9, wall_clock_breakdown=False)
    precision = None
    for name in PRECISIONS:
        section = config.get(name)
        if not isinstance(section, dict):
            continue
        enabled = section.get("enabled")
        if enabled == "auto":
            enabled = name == "bf16" and bf16_supported
            section["enabled"] = enabled
            replaced.append(f"{name}.enabled (auto: {'on' if enabled else 'off'})")
        if enabled is True:
            precision = name
    _fill_auto(config, "", replaced)
    return config, replaced, precision


# What the Hugging Face Trainer fills from the model's hidden size (trainer_config_finalize), for this model.
HIDDEN_SIZE_AUTO = {"zero_optimization.reduce_bucket_size": D_MODEL * D_MODEL,
                    "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * D_MODEL * D_MODEL),
                    "zero_optimization.stage3_param_persistence_threshold": 10 * D_MODEL}


def _fill_auto(section, prefix, replaced):
    for key, value in list(section.items()):
        if isinstance(value, dict):
            _fill_auto(value, f"{prefix}{key}.", replaced)
        elif value == "auto" and f"{prefix}{key}" in HIDDEN_SIZE_AUTO:
            section[key] = HIDDEN_SIZE_AUTO[f"{prefix}{key}"]
            replaced.append(f"{prefix}{key} (auto: {section[key]}, as the Trainer fills it for this model)")
        elif value == "auto":
            del section[key]
            replaced.append(f"{prefix}{key} (auto: DeepSpeed's default)")


def check_user_config(ctx):
    ctx.need_dist()
    if not ctx.args.ds_config:
        raise SkipCheck("no --config given")
    from .context import accelerator  # noqa: PLC0415

    with open(ctx.args.ds_config, encoding="utf-8") as stream:
        user = json.load(stream)
    acc = accelerator()
    config, replaced, precision = suite_config(user, bf16_supported=acc.is_bf16_supported())
    if precision == "fp16" and acc._name == "cpu":
        raise SkipCheck("the config trains in fp16, which needs a GPU loss scaler path; not run on the CPU "
                        "accelerator")
    if precision == "bf16" and not acc.is_bf16_supported():
        raise SkipCheck(f"the config trains in bf16; the {acc._name} accelerator reports no bf16 support")
    zero = config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    details = train_and_judge(ctx, config, rtol=LOW_PRECISION_RTOL if precision else LOSS_RTOL,
                              inspect=partition_details(ctx, stage) if stage else None)
    offload = [k for k in ("offload_optimizer", "offload_param")
               if isinstance(zero.get(k), dict) and zero[k].get("device", "none") != "none"]
    return {**details, "stage": stage, "offload": offload, "precision": precision or "fp32",
            "replaced_for_the_comparison": replaced}


def amd_patch_present(ctx):
    import importlib.util  # noqa: PLC0415

    from deepspeed.runtime import config as ds_runtime_config  # noqa: PLC0415

    # mlstack-ds's patch 0014 adds deepspeed/runtime/amd_specific.py and wires get_amd_config into
    # runtime.config; the other names are kept for builds patched another way.
    if importlib.util.find_spec("deepspeed.runtime.amd_specific") is not None or any(
            hasattr(ds_runtime_config, n) for n in ("get_amd_config", "AMD_SPECIFIC", "get_amd_specific_config")):
        return True, "DeepSpeed defines the amd_specific config section (deepspeed.runtime.amd_specific)"
    patches = (ctx.receipt or {}).get("patches") or []
    named = [p for p in patches if "amd" in str(p).lower() and "specific" in str(p).lower()]
    if named:
        return True, f"receipt lists {named[0]}"
    return False, "unpatched build: DeepSpeed has no amd_specific config section"


def check_amd_specific(ctx):
    ctx.need_deepspeed()
    present, why = amd_patch_present(ctx)
    if not present:
        raise SkipCheck(why)
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

    base = {"train_micro_batch_size_per_gpu": 1}
    DeepSpeedConfig({**base, "amd_specific": {}}, mpu=None)
    try:
        DeepSpeedConfig({**base, "amd_specific": {"mlstack_no_such_key": 1}}, mpu=None)
    except Exception as exc:
        return {"patch": why, "invalid_key_rejected": f"{type(exc).__name__}: {str(exc)[:200]}"}
    raise CheckFailed("an invalid key in amd_specific was accepted", {"patch": why})


CHECKS = (
    Check("amd_specific", "the patched `amd_specific` config section (skipped on unpatched builds)", ("deepspeed",),
          check_amd_specific),
    Check("config", "the suite's model trained under your `--config` (stage, offload, precision, buckets as "
          "given) against the torch reference", ("deepspeed", "distributed"), check_user_config, default=False),
)

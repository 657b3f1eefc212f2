"""Checks of DeepSpeed's configuration surface that this tool's patches add."""

from __future__ import annotations

from .protocol import Check, CheckFailed, SkipCheck


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
)

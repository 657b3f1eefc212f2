"""What every check needs: rank and world, the receipt, the imported torch and deepspeed, the process group."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path

from .protocol import CheckFailed, JitBuildRefused

RECEIPT_RELATIVE = ("share", "mlstack-ds", "receipt.json")


class Context:
    """What every check needs: rank, world, receipt, and lazily the imported torch/deepspeed."""

    def __init__(self, args, rank, world_size):
        self.args = args
        self.rank = rank
        self.world_size = world_size
        self.out_dir = Path(args.out)
        self.receipt_path = Path(args.receipt) if args.receipt else Path(sys.prefix, *RECEIPT_RELATIVE)
        self.receipt, self.receipt_error = load_receipt(self.receipt_path)
        self.torch = None
        self.deepspeed = None
        self.import_error = None
        self.dist_ready = False
        self.dist_error = None

    def need_deepspeed(self):
        if self.deepspeed is None:
            raise CheckFailed(f"deepspeed is not importable: {self.import_error}")
        return self.deepspeed

    def need_dist(self):
        self.need_deepspeed()
        if not self.dist_ready:
            raise CheckFailed(f"torch.distributed could not be initialised: {self.dist_error}")


def load_receipt(path):
    if not path.is_file():
        return None, None
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"unreadable receipt {path}: {exc}"


def refuse_jit(deepspeed_module):
    """Make any run-time op compilation raise instead of silently compiling for minutes."""
    from deepspeed.ops.op_builder import builder as builder_module  # noqa: PLC0415

    def jit_load(self, verbose=True):
        raise JitBuildRefused(f"op {self.name!r} is not prebuilt: DeepSpeed tried to JIT-compile it")

    builder_module.OpBuilder.jit_load = jit_load
    return deepspeed_module


def accelerator():
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    return get_accelerator()


def finite(value):
    return value is not None and math.isfinite(value)


def close(a, b, rtol, atol):
    return abs(a - b) <= atol + rtol * abs(b)


def import_targets(ctx, allow_jit):
    try:
        ctx.torch = importlib.import_module("torch")
    except Exception as exc:
        ctx.import_error = f"{type(exc).__name__}: {exc}"
        return
    try:
        ctx.deepspeed = importlib.import_module("deepspeed")
        if not allow_jit:
            refuse_jit(ctx.deepspeed)
    except Exception as exc:
        ctx.deepspeed = None
        ctx.import_error = f"{type(exc).__name__}: {exc}"


def init_distributed(ctx, timeout_s):
    """One process group for the whole launch; collectives time out with the launch."""
    # Longer than the launch time-out, so a stuck collective is ended by the launcher killing the
    # ranks (reported as a time-out) rather than by a gloo error on the one rank still waiting.
    timeout = timedelta(seconds=timeout_s + 30)
    try:
        if ctx.deepspeed is not None:
            ctx.deepspeed.init_distributed(timeout=timeout)
        elif ctx.torch is not None:
            ctx.torch.distributed.init_process_group("gloo", timeout=timeout)
        else:
            ctx.dist_error = "torch is not importable"
            return
        ctx.dist_ready = ctx.deepspeed is not None
        if ctx.dist_ready and accelerator()._name != "cpu":
            accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per rank
    except Exception as exc:
        ctx.dist_error = f"{type(exc).__name__}: {exc}"

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

    def __init__(self, args, rank, world_size, log=None):
        self.args = args
        self.log = log  # the rank's ResultLog, for `progress`
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

    def progress(self, event, **fields):
        """One progress line in the rank's file (the tool's stall rule sees it), where there is one."""
        if self.log is not None:
            self.log.write({"event": event, "rank": self.rank, **fields})

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
            set_local_size(os.environ)
            ctx.deepspeed.init_distributed(timeout=timeout)
            release_shm_workspace(ctx)
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


def set_local_size(env):
    """LOCAL_SIZE as DeepSpeed's own launcher sets it (ranks on this node), from torchrun's LOCAL_WORLD_SIZE.

    DeepSpeed's CPU shared-memory all-reduce initialises only when LOCAL_SIZE equals the world size, and
    0.19.x's inference_all_reduce then uses it; launched by torchrun (no LOCAL_SIZE) it dereferences the
    workspace it never made and the rank dies of SIGSEGV. The ranks run as a `deepspeed`-launched job would."""
    if "LOCAL_SIZE" not in env and env.get("LOCAL_WORLD_SIZE"):
        env["LOCAL_SIZE"] = env["LOCAL_WORLD_SIZE"]


def release_shm_workspace(ctx):
    """Unlink this rank's /dev/shm all-reduce workspace once every rank has mapped every other's.

    DeepSpeed creates one 66 MiB file per rank, named by MASTER_PORT, and never removes it: each launch would
    leave its files in /dev/shm for good. The mappings live on until the ranks exit."""
    from deepspeed.comm import comm as ds_comm  # noqa: PLC0415

    from .comm_checks import shm_workspace_file  # noqa: PLC0415

    dist = ctx.torch.distributed
    # The same answer on every rank (the op loaded, LOCAL_SIZE == world: what shm_initialize itself asks), so
    # they all take the barrier or none does.
    if getattr(ds_comm.cdb, "shm_comm_op", None) is None or os.environ.get("LOCAL_SIZE") != str(dist.get_world_size()):
        return
    dist.barrier()  # every rank is past shm_initialize, which opens the others' files
    shm_workspace_file(dist.get_rank()).unlink(missing_ok=True)

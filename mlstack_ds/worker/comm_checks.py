"""DeepSpeed's own collectives against the sum they must compute: the CPU's shared-memory all-reduce.

`deepspeed_shm_comm` is what `deepspeed.comm.inference_all_reduce` runs on the CPU accelerator (AutoTP
inference's all-reduce) when every rank is on one node. It has three paths by message size (one buffer for
messages under 1 MiB, a reduce split across ranks up to 32 MiB, and a loop over 32 MiB chunks above that) and
one kernel per dtype; each is run here. The values are multiples of 1/8 small enough that every partial sum is
exact in bf16, so the result is compared bitwise whatever order the kernel adds in.
"""

from __future__ import annotations

import os
from pathlib import Path

from .optimizer_checks import require_built
from .protocol import Check, CheckFailed, SkipCheck

# Element counts per dtype width: under the 1 MiB single-buffer path, between it and the 32 MiB chunk, and past
# one chunk with an odd remainder (the kernels' vector loops have scalar tails).
SHM_SIZES = {4: (1000, (1 << 19) + 3, (9 << 20) + 5), 2: (1000, (1 << 20) + 3, (17 << 20) + 5)}
SHM_DTYPES = ("float32", "bfloat16", "float16")
# Integers in [-16, 16] over 8: any sum of up to 8 ranks is k/8 with |k| <= 128, 8 significant bits at most,
# exact in bf16 (8) and fp16 (11). More ranks are compared within one bf16 rounding of the true sum.
SHM_EXACT_RANKS = 8
SHM_VALUE_RANGE = 16
SHM_BUFFER_PREFIX = "deepspeed_allreduce_buffer"  # csrc/cpu/comm/shm.cpp's SHM_BUFFER_NAME


def shm_values(torch, rank, numel, dtype):
    """Rank `rank`'s input: the same numbers on every platform, from a CPU generator seeded by the rank."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return (torch.randint(-SHM_VALUE_RANGE, SHM_VALUE_RANGE + 1, (numel,), generator=gen).float() / 8).to(dtype)


def shm_expected(torch, world_size, numel, dtype):
    """The all-reduced sum, added in float32 (exact for these values) and rounded to `dtype` once."""
    total = torch.zeros(numel)
    for rank in range(world_size):
        total += shm_values(torch, rank, numel, torch.float32)
    return total.to(dtype)


def shm_workspace_file(rank: int, env=os.environ) -> Path:
    """The /dev/shm file DeepSpeed's shm_initialize creates for this rank (named by uid, MASTER_ADDR/PORT)."""
    return Path("/dev/shm", f"{SHM_BUFFER_PREFIX}_{os.getuid()}_{env.get('MASTER_ADDR', '')}_"
                            f"{env.get('MASTER_PORT', '')}_{rank}")


def check_shm_comm(ctx):
    """deepspeed.comm.inference_all_reduce through the shared-memory op == the exact sum of every rank's input,
    bitwise, for fp32, bf16 and fp16 on each of its three size paths."""
    require_built(ctx, "deepspeed_shm_comm")
    ctx.need_dist()
    torch = ctx.torch
    if ctx.world_size < 2:
        raise SkipCheck("one rank: inference_all_reduce returns its input without reducing")
    if os.environ.get("LOCAL_SIZE") != str(ctx.world_size):
        raise SkipCheck(f"the {ctx.world_size} ranks are not all on one node (LOCAL_SIZE="
                        f"{os.environ.get('LOCAL_SIZE')}): DeepSpeed uses its shared-memory all-reduce only then")
    from deepspeed.comm import comm as ds_comm  # noqa: PLC0415

    backend = ds_comm.cdb
    if getattr(backend, "shm_comm_op", None) is None:
        raise CheckFailed("deepspeed_shm_comm is built, but DeepSpeed's communication backend did not load it")
    if not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        raise CheckFailed("deepspeed_shm_comm loaded without registering torch.ops.deepspeed.inference_all_reduce_")
    # 0.19.8 runs the kernels only at the vector level the CPU has (else falls back to the process group).
    level = getattr(backend, "shm_vector_kernel_level", None)
    problems, cases = [], 0
    for name in SHM_DTYPES:
        dtype = getattr(torch, name)
        for numel in SHM_SIZES[dtype.itemsize]:
            tensor = shm_values(torch, ctx.rank, numel, dtype)
            result = ds_comm.inference_all_reduce(tensor)
            want = shm_expected(torch, ctx.world_size, numel, dtype)
            cases += 1
            if ctx.world_size <= SHM_EXACT_RANKS:
                wrong = int((result != want).sum())
            else:
                wrong = int(((result.float() - want.float()).abs() > want.float().abs() * 2.0**-8).sum())
            if wrong:
                problems.append(f"{name} x {numel}: {wrong} elements differ from the sum over ranks")
    details = {"cases": cases, "dtypes": list(SHM_DTYPES), "ranks": ctx.world_size,
               "sizes_bytes": sorted({n * w for w, sizes in SHM_SIZES.items() for n in sizes}),
               "vector_kernel_level": level, "comparison": "bitwise (exact sums)"
               if ctx.world_size <= SHM_EXACT_RANKS else "within one bf16 rounding"}
    if problems:
        raise CheckFailed("inference_all_reduce: " + "; ".join(problems), details)
    return details


CHECKS = (
    Check("shm_comm", "the CPU's shared-memory inference_all_reduce equals the sum over ranks, bitwise, for "
          "fp32/bf16/fp16 at each size path (skipped where not built or ranks span nodes)",
          ("deepspeed", "distributed", "op:deepspeed_shm_comm"), check_shm_comm),
)

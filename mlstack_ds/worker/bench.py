"""One rank of `mlstack-ds bench`: `python -m mlstack_verify_worker.bench --stage S --out DIR ...`.

Times training steps of a GPT-like model (training.build_model at the given shape) on synthetic tokens
under plain DistributedDataParallel (`--stage ddp`) or a DeepSpeed ZeRO stage, after warm-up steps that
are not timed. Prebuilt ops only: a JIT compile raises (context.refuse_jit) and fails the run. Running
out of memory is a result ("oom"), not a failure: every rank writes what it saw as one `bench` record in the
protocol's result file, and rank 0 appends progress lines (step, elapsed) to `progress.jsonl` for the tool to show.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path

from .context import Context, accelerator, import_targets, init_distributed
from .protocol import PROGRESS_FILE, JitBuildRefused, ResultLog, die_with_parent
from .training import build_model

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", required=True, help="ddp, or a ZeRO stage 0-3")
    parser.add_argument("--out", required=True, help="directory for rank<N>.jsonl and progress.jsonl")
    for name in ("layers", "hidden", "heads", "vocab", "seq-len", "micro-batch", "steps", "warmup"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    parser.add_argument("--ds-config", default="", help="the user's DeepSpeed config (JSON), the base of ZeRO runs")
    parser.add_argument("--memory-cap", type=int, default=0, help="bytes per rank beyond what is in use now; 0: none")
    parser.add_argument("--timeout", type=float, default=600.0, help="collective time-out, seconds")
    parser.add_argument("--run-id", default="", help="marker that identifies this launch's processes")
    parser.add_argument("--receipt", default="")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def is_oom(exc):
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in OOM_MARKERS)


def status_bytes(field):
    """A size line of /proc/self/status (VmSize: the address space) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def apply_memory_cap(ctx, cap):
    """Accelerator: a fraction of the device's memory. CPU: the address space may grow by `cap` bytes from
    here (torch, DeepSpeed and the process group are already in it), so the model's own memory is capped."""
    if not cap:
        return None
    acc = accelerator()
    if acc._name != "cpu":  # ROCm and CUDA alike: torch.cuda
        device = ctx.torch.cuda.current_device()
        total = ctx.torch.cuda.get_device_properties(device).total_memory
        ctx.torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
        return "accelerator"
    ctx.torch.ones(1024, 1024).sum()  # start torch's thread pool before the cap, so its stacks are not counted
    limit = status_bytes("VmSize") + cap
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return "address space"


def choose_precision(requested, acc):
    if requested != "auto":
        return requested
    if acc._name == "cpu":
        return "fp32"  # the CPU accelerator's bf16 is emulated and slower than fp32: not what users run
    return "bf16" if acc.is_bf16_supported() else "fp16"


def zero_config(args, precision):
    config = {}
    if args.ds_config:
        config = json.loads(Path(args.ds_config).read_text(encoding="utf-8"))
    config.pop("train_batch_size", None)
    config["train_micro_batch_size_per_gpu"] = args.micro_batch
    config.setdefault("gradient_accumulation_steps", 1)
    config.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}})
    config["zero_optimization"] = {**config.get("zero_optimization", {}), "stage": int(args.stage)}
    config.setdefault("steps_per_print", 10**9)
    if not args.ds_config:
        for key in ("bf16", "fp16"):
            config.pop(key, None)
        if precision in ("bf16", "fp16"):
            config[precision] = {"enabled": True}
    return config


def live_tensor_bytes(torch):
    """Bytes of every tensor storage alive in this process, each storage once: what the model states,
    buffers and ZeRO's flat partitions hold, without the allocator's caching and fragmentation that RSS
    also counts."""
    import gc  # noqa: PLC0415

    seen, total = set(), 0
    for obj in gc.get_objects():
        with contextlib.suppress(Exception):
            if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                storage = obj.untyped_storage()
                key = (obj.device.type, storage.data_ptr())
                if key not in seen and storage.data_ptr():
                    seen.add(key)
                    total += storage.nbytes()
    return total


def flops_per_sample(n_params, embedding_params, layers, hidden, seq):
    """Training FLOPs of one sequence: 6 per non-embedding parameter and token (forward 2, backward 4),
    plus attention's 6·L·T²·h (Kaplan et al. 2020, table 1: C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn)."""
    return 6 * (n_params - embedding_params) * seq + 6 * layers * seq * seq * hidden


class Progress:
    """Rank 0's progress lines for the tool; the other ranks stay quiet."""

    def __init__(self, out_dir, rank, stage):
        self.path = Path(out_dir) / PROGRESS_FILE if rank == 0 else None
        self.stage = stage
        self.started = time.monotonic()

    def write(self, phase, step=0, of=0):
        if self.path is None:
            return
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"stage": self.stage, "phase": phase, "step": step, "of": of,
                                     "elapsed_s": round(time.monotonic() - self.started, 2)}) + "\n")


def run(ctx, args, result, progress):
    torch = ctx.torch
    acc = accelerator()
    precision = choose_precision(args.precision, acc)
    result["precision"] = precision
    result["accelerator"] = acc._name
    result["memory_cap"] = apply_memory_cap(ctx, args.memory_cap)
    device = acc.current_device_name() if acc._name != "cpu" else "cpu"
    torch.manual_seed(1234)
    result["phase"] = "model"
    config = None if args.stage == "ddp" else zero_config(args, precision)
    # ZeRO-3 builds the model already partitioned (zero.Init), as users of large models do: a full copy
    # on every rank first would be the peak the stage exists to avoid.
    building = (ctx.deepspeed.zero.Init(config_dict_or_path=config) if config and int(args.stage) == 3
                else contextlib.nullcontext())
    with building:
        model = build_model(torch, vocab=args.vocab, d_model=args.hidden, d_ff=4 * args.hidden,
                            n_layers=args.layers, n_heads=args.heads)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    result["params"] = n_params
    embedding = getattr(model.embed.weight, "ds_numel", model.embed.weight.numel())
    result["flops_per_sample"] = flops_per_sample(n_params, embedding, args.layers, args.hidden, args.seq_len)
    gen = torch.Generator().manual_seed(4321 + ctx.rank)
    tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen)
    inputs, targets = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    result["phase"] = "initialize"
    if args.stage == "ddp":
        model = model.to(device)
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        scaler = torch.amp.GradScaler() if precision == "fp16" else None
        gas = 1

        def step():
            with torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype is not None):
                loss = wrapped(inputs, targets)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss
    else:
        gas = int(config["gradient_accumulation_steps"])
        engine, *_ = ctx.deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        result["precision"] = ("bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled()
                               else "fp32")

        def step():
            for _ in range(gas):
                loss = engine(inputs, targets)
                engine.backward(loss)
                engine.step()
            return loss
    result["gradient_accumulation_steps"] = gas
    result["samples_per_step"] = args.micro_batch * gas * ctx.world_size
    times = []
    for index in range(args.warmup + args.steps):
        timed = index >= args.warmup
        result["phase"] = f"step {index + 1}"
        ctx.torch.distributed.barrier()
        started = time.perf_counter()
        loss = step()
        acc.synchronize()
        ctx.torch.distributed.barrier()
        if timed:
            times.append(time.perf_counter() - started)
        if not torch.isfinite(loss.detach().float()).item():
            raise FloatingPointError(f"loss is {loss.item()} at step {index + 1}")
        progress.write("timed" if timed else "warm-up", index + 1, args.warmup + args.steps)
    result["step_times_s"] = times
    result["live_tensor_bytes"] = live_tensor_bytes(torch)
    result["loss"] = float(loss.detach().float().item())
    if acc._name != "cpu":
        result["peak_accelerator_bytes"] = int(acc.max_memory_allocated())
    result["phase"] = "done"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(argparse.Namespace(out=args.out, receipt=args.receipt), rank, world_size)
    progress = Progress(out_dir, rank, args.stage)
    progress.write("start")
    result = {"rank": rank, "world_size": world_size, "stage": args.stage, "status": "ok", "reason": "",
              "phase": "import", "host": os.uname().nodename}
    code = 0
    try:
        import_targets(ctx, allow_jit=False)
        if ctx.torch is None or (ctx.deepspeed is None and args.stage != "ddp"):
            raise ImportError(ctx.import_error or "deepspeed is not importable")
        result["phase"] = "process group"
        init_distributed(ctx, args.timeout)
        if not ctx.torch.distributed.is_initialized():
            if (ctx.dist_error or "").startswith(JitBuildRefused.__name__):  # init loads the comm op
                raise JitBuildRefused(ctx.dist_error.split(": ", 1)[-1])
            raise RuntimeError(f"torch.distributed could not be initialised: {ctx.dist_error}")
        run(ctx, args, result, progress)
    except JitBuildRefused as exc:
        result.update(status="jit", reason=str(exc))
        code = 3
    except BaseException as exc:  # the rank's outcome is data for the tool; the launcher sees the exit code
        oom = is_oom(exc)
        result.update(status="oom" if oom else "error", reason=f"{type(exc).__name__}: {exc}".strip()[:2000])
        code = 3 if oom else 4
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ResultLog(out_dir, rank).write({"event": "bench", **result})
    progress.write("end")
    if code == 0 and ctx.torch is not None and ctx.torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            ctx.torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown: a failed rank must not wait on collectives at exit


if __name__ == "__main__":
    main()

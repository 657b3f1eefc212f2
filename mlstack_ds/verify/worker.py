"""mlstack-ds verify worker: one rank of the check suite, run inside the *target* interpreter.

Self-contained on purpose: it imports only the standard library, torch and deepspeed (never
mlstack_ds), because the target environment need not have the tool installed. It is executed by path
under a standard launcher (`python -m torch.distributed.run ... worker.py --checks a,b --out DIR`).

Protocol (read by mlstack_ds/verify/launch.py):
- every rank appends JSON lines to `DIR/rank<R>.jsonl` as it goes: `{"event": "start", "check": ...}`
  before a check and `{"event": "result", ...}` after it, so a rank that hangs or dies still leaves
  the checks it finished and the one it was in;
- at the end rank 0 gathers every rank's results (through torch.distributed, so remote nodes count
  too) into `DIR/summary.json`.

Fault injection for tests of the absent-failure paths (a real hang or crash cannot be provoked on a
healthy install): `MLSTACK_VERIFY_TEST_FAULT=hang:rank1` or `crash:rank1`, optionally `:<check>` to
fire at the start of that check instead of the first one.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import importlib
import importlib.util
import json
import math
import os
import resource
import shutil
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

PROTOCOL_VERSION = 1
RECEIPT_RELATIVE = ("share", "mlstack-ds", "receipt.json")

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


class SkipCheck(Exception):
    """The check does not apply here; the message is the reason."""


class CheckFailed(Exception):
    """The check ran and found a problem; `details` go into the report."""

    def __init__(self, reason, details=None):
        super().__init__(reason)
        self.details = details or {}


class JitBuildRefused(RuntimeError):
    """DeepSpeed tried to compile an op at run time; the suite treats that as a failure."""


# ----------------------------------------------------------------------------------------------
# plumbing


class ResultLog:
    """Append-only JSON lines for one rank: survives a hang or crash of this process."""

    def __init__(self, out_dir, rank):
        self.path = Path(out_dir) / f"rank{rank}.jsonl"
        self.records = []

    def write(self, record):
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if record.get("event") == "result":
            self.records.append(record)


def die_with_parent():
    """Ask Linux to SIGKILL this rank when its launcher dies, so a killed launch leaves no orphans."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def parse_fault(spec, rank):
    """`hang:rank1[:check]` -> ("hang", check or None) for rank 1; None for other ranks."""
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] not in ("hang", "crash") or parts[1] != f"rank{rank}":
        return None
    return parts[0], (parts[2] if len(parts) > 2 else None)


def fire_fault(fault, check, first):
    if fault is None or (fault[1] is None and not first) or (fault[1] is not None and fault[1] != check):
        return
    if fault[0] == "crash":
        sys.stderr.write(f"verify worker: injected crash before {check}\n")
        sys.stderr.flush()
        os._exit(17)
    while True:  # hang: only the launch time-out ends this
        time.sleep(3600)


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


# ----------------------------------------------------------------------------------------------
# the model


def build_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D_MODEL)
            self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
            self.proj = nn.Linear(D_MODEL, D_MODEL)
            self.ln2 = nn.LayerNorm(D_MODEL)
            self.fc1 = nn.Linear(D_MODEL, D_FF)
            self.fc2 = nn.Linear(D_FF, D_MODEL)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, N_HEADS, D_MODEL // N_HEADS).unbind(2)
            att = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, D_MODEL))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
            self.ln_f = nn.LayerNorm(D_MODEL)
            self.head = nn.Linear(D_MODEL, VOCAB)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x)).float()
            return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    return TinyLM()


def global_batch(torch, world_size):
    """The same seeded batch on every rank; rank r trains on rows [r*MICRO, (r+1)*MICRO)."""
    gen = torch.Generator().manual_seed(4321)
    tokens = torch.randint(0, VOCAB, (world_size * MICRO_BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


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


class Trainer:
    """A DeepSpeed engine and a plain torch AdamW copy of the same model, stepped side by side."""

    def __init__(self, ctx, config, seed=1234):
        torch, deepspeed = ctx.torch, ctx.deepspeed
        self.ctx, self.torch = ctx, torch
        torch.manual_seed(seed)
        model = build_model(torch)
        self.reference = copy.deepcopy(model)
        self.ref_optimizer = torch.optim.AdamW(self.reference.parameters(), **ADAM)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
        x, y = global_batch(torch, ctx.world_size)
        rows = slice(ctx.rank * MICRO_BATCH, (ctx.rank + 1) * MICRO_BATCH)
        device = self.engine.device
        self.local = (x[rows].to(device), y[rows].to(device))
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
    trainer = Trainer(ctx, config)
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


# ----------------------------------------------------------------------------------------------
# checks


def check_environment(ctx):
    if ctx.torch is None:
        raise CheckFailed(f"torch is not importable: {ctx.import_error}")
    torch = ctx.torch
    details = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
               "torch_hip": getattr(torch.version, "hip", None), "torch_cuda": torch.version.cuda,
               "receipt_path": str(ctx.receipt_path), "receipt": ctx.receipt is not None}
    if ctx.deepspeed is None:
        raise CheckFailed(f"deepspeed is not importable: {ctx.import_error}", details)
    deepspeed = ctx.deepspeed
    from deepspeed import git_version_info  # noqa: PLC0415

    acc = accelerator()
    details.update(deepspeed=deepspeed.__version__,
                   deepspeed_git_hash=getattr(deepspeed, "__git_hash__", None),
                   deepspeed_git_branch=getattr(deepspeed, "__git_branch__", None),
                   accelerator=acc._name, built_for_accelerator=git_version_info.accelerator_name,
                   communication_backend=acc.communication_backend_name(),
                   device_count=acc.device_count() if acc._name != "cpu" else 0,
                   archs=device_archs(torch, acc))
    problems = []
    if ctx.receipt_error:
        problems.append(ctx.receipt_error)
    if ctx.receipt is not None:
        receipt = ctx.receipt
        want_acc = {"cpu": "cpu", "rocm": "cuda", "cuda": "cuda"}.get(str(receipt.get("platform")))
        details["planned_accelerator"] = want_acc
        if want_acc and acc._name != want_acc:
            problems.append(f"accelerator is {acc._name!r}, the receipt planned {want_acc!r} "
                            f"(platform {receipt.get('platform')})")
        installed = deepspeed.__version__.split("+")[0]
        if str(receipt.get("deepspeed_version", "")).split("+")[0] != installed:
            problems.append(f"installed DeepSpeed {deepspeed.__version__} is not the receipt's "
                            f"{receipt.get('deepspeed_version')}")
        missing_archs = sorted(set(details["archs"]) - set(receipt.get("archs") or []))
        if details["archs"] and missing_archs:
            problems.append(f"GPU arch(s) {', '.join(missing_archs)} present but not built for "
                            f"(receipt archs: {receipt.get('archs')})")
    elif acc._name != git_version_info.accelerator_name:
        problems.append(f"accelerator is {acc._name!r} but DeepSpeed was built for "
                        f"{git_version_info.accelerator_name!r}")
    if not ctx.dist_ready:
        problems.append(f"torch.distributed did not initialise: {ctx.dist_error}")
    if problems:
        raise CheckFailed("; ".join(problems), details)
    if ctx.receipt is None:
        details["note"] = f"no receipt at {ctx.receipt_path}; compared against DeepSpeed's own build info"
    return details


def device_archs(torch, acc):
    if acc._name != "cuda" or not torch.cuda.is_available():
        return []
    archs = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
        archs.append(arch.split(":")[0])
    return archs


def expected_ops(ctx):
    from deepspeed.git_version_info import installed_ops  # noqa: PLC0415

    if ctx.receipt is not None and "ops" in ctx.receipt:
        return list(ctx.receipt["ops"]), "receipt"
    return sorted(name for name, built in installed_ops.items() if built), "deepspeed installed_ops"


def check_prebuilt_ops(ctx):
    ctx.need_deepspeed()
    from deepspeed.git_version_info import installed_ops  # noqa: PLC0415
    from deepspeed.ops.op_builder.all_ops import ALL_OPS  # noqa: PLC0415

    names, source = expected_ops(ctx)
    details = {"source": source, "ops": {}}
    if not names:
        raise CheckFailed(f"no prebuilt ops according to {source}: DeepSpeed was installed without "
                          "DS_BUILD_* ops, so every op would be JIT-compiled at first use", details)
    failures = []
    for name in names:
        builder = ALL_OPS.get(name)
        if builder is None:
            failures.append(f"{name}: unknown to this DeepSpeed/accelerator")
            continue
        if not installed_ops.get(name, False):
            failures.append(f"{name}: the {source} lists it but DeepSpeed's installed_ops says not built")
            continue
        if importlib.util.find_spec(builder.absolute_name()) is None:
            failures.append(f"{name}: prebuilt module {builder.absolute_name()} is missing")
            continue
        started = time.monotonic()
        try:
            module = builder.load()
        except JitBuildRefused as exc:
            failures.append(str(exc))
            continue
        except Exception as exc:
            failures.append(f"{name}: load failed: {type(exc).__name__}: {exc}")
            continue
        seconds = time.monotonic() - started
        details["ops"][name] = {"module": module.__name__, "load_s": round(seconds, 4),
                                "file": getattr(module, "__file__", None)}
        if module.__name__ != builder.absolute_name():
            failures.append(f"{name}: loaded {module.__name__}, not the prebuilt {builder.absolute_name()}")
    if failures:
        raise CheckFailed("; ".join(failures), details)
    return details


def optimizer_against_torch(ctx, make_ds, make_ref, label, device="cpu"):
    torch = ctx.torch
    gen = torch.Generator().manual_seed(99)
    shapes = [(256, 64), (1000,), (33, 7)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(OPTIMIZER_STEPS)]
    ds_params = [torch.nn.Parameter(t.clone().to(device)) for t in start]
    ref_params = [torch.nn.Parameter(t.clone()) for t in start]
    ds_opt, ref_opt = make_ds(ds_params), make_ref(ref_params)
    worst = 0.0
    for step, step_grads in enumerate(grads, start=1):
        for p, q, g in zip(ds_params, ref_params, step_grads, strict=True):
            p.grad = g.clone().to(device)
            q.grad = g.clone()
        ds_opt.step()
        ref_opt.step()
        diff = max(float((p.detach().cpu() - q.detach()).abs().max()) for p, q in zip(ds_params, ref_params,
                                                                                     strict=True))
        worst = max(worst, diff)
        if not diff <= OPTIMIZER_ATOL:
            raise CheckFailed(f"step {step}: {label} differs from torch by {diff:g} "
                              f"(tolerance {OPTIMIZER_ATOL:g})", {"max_abs_diff": worst})
    return {"steps": OPTIMIZER_STEPS, "max_abs_diff": worst, "tolerance": OPTIMIZER_ATOL,
            "reference": "torch.optim.AdamW"}


def check_fused_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import FusedAdam  # noqa: PLC0415

    device = accelerator().current_device_name()
    return optimizer_against_torch(ctx, lambda ps: FusedAdam(ps, adam_w_mode=True, **ADAM),
                                   lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), "FusedAdam", device)


def check_cpu_adam(ctx):
    ctx.need_deepspeed()
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: PLC0415

    return optimizer_against_torch(ctx, lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **ADAM),
                                   lambda ps: ctx.torch.optim.AdamW(ps, **ADAM), "DeepSpeedCPUAdam")


def check_only_if_built(op_name):
    def check(ctx):
        ctx.need_deepspeed()
        names, source = expected_ops(ctx)
        if op_name not in names:
            raise SkipCheck(f"{op_name} is not built ({source})")
        raise CheckFailed(f"{op_name} is built but this suite has no numerical test for it yet")

    return check


def check_zero(stage, offload_optimizer=False, offload_param=False):
    def check(ctx):
        config = ds_config(stage, offload_optimizer, offload_param)
        return train_and_judge(ctx, config, inspect=partition_details(ctx, stage))

    return check


def check_precision(ctx):
    ctx.need_dist()
    acc = accelerator()
    results, skipped = {}, {}
    for precision, supported in (("bf16", acc.is_bf16_supported()), ("fp16", acc.is_fp16_supported())):
        if not supported:
            skipped[precision] = f"{acc._name} accelerator reports no {precision} support"
            continue
        if precision == "fp16" and acc._name == "cpu":
            skipped[precision] = "fp16 training needs a GPU loss scaler path; not run on the CPU accelerator"
            continue
        results[precision] = train_and_judge(ctx, ds_config(2, precision=precision), rtol=LOW_PRECISION_RTOL)
    if not results:
        raise SkipCheck("; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return {"ran": results, "skipped": skipped}


def check_checkpoint(ctx):
    """ZeRO-3: train, save, load into a fresh engine (other seed), compare weights, train on."""
    ctx.need_dist()
    torch = ctx.torch
    ckpt_dir = ctx.out_dir / "checkpoint"
    config = ds_config(3)
    first = Trainer(ctx, config)
    try:
        first.run(STEPS // 2)
        first.engine.save_checkpoint(str(ckpt_dir), tag="verify")
        saved = full_parameters(ctx, first.engine)
        reference, ref_optimizer = first.reference, first.ref_optimizer
        losses, ref_losses = list(first.losses), list(first.ref_losses)
    finally:
        first.destroy()
    del first
    second = Trainer(ctx, config, seed=777)
    try:
        second.engine.load_checkpoint(str(ckpt_dir), tag="verify")
        loaded = full_parameters(ctx, second.engine)
        mismatched = [i for i, (a, b) in enumerate(zip(saved, loaded, strict=True)) if not torch.equal(a, b)]
        second.reference, second.ref_optimizer = reference, ref_optimizer
        second.run(STEPS - STEPS // 2)
        losses += second.losses
        ref_losses += second.ref_losses
        details = {"saved_tensors": len(saved), "mismatched_after_reload": len(mismatched),
                   "losses": [round(v, 6) for v in losses],
                   "reference_losses": [round(v, 6) for v in ref_losses],
                   "reloaded_at_step": STEPS // 2 + 1}
        problems = [f"{len(mismatched)} of {len(saved)} parameters differ after reload"] if mismatched else []
        deviation = compare_curves(losses, ref_losses, LOSS_RTOL)
        if deviation:
            problems.insert(0, deviation)
        if problems:
            raise CheckFailed("; ".join(problems), details)
        return details
    finally:
        second.destroy()
        if ctx.rank == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)


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


CHECKS = {
    "environment": check_environment,
    "prebuilt_ops": check_prebuilt_ops,
    "fused_adam": check_fused_adam,
    "cpu_adam": check_cpu_adam,
    "fused_lamb": check_only_if_built("fused_lamb"),
    "fused_lion": check_only_if_built("fused_lion"),
    "zero1": check_zero(1),
    "zero2": check_zero(2),
    "zero3": check_zero(3),
    "zero2_offload": check_zero(2, offload_optimizer=True),
    "zero3_offload": check_zero(3, offload_optimizer=True, offload_param=True),
    "precision": check_precision,
    "checkpoint": check_checkpoint,
    "amd_specific": check_amd_specific,
}


# ----------------------------------------------------------------------------------------------
# main


def peak_memory(ctx):
    """Peak accelerator memory since the last reset, where the accelerator reports it (not on CPU)."""
    if ctx.deepspeed is None:
        return None
    with contextlib.suppress(Exception):
        acc = accelerator()
        if acc._name != "cpu":
            return int(acc.max_memory_allocated())
    return None


def reset_peak(ctx):
    if ctx.deepspeed is None:
        return
    with contextlib.suppress(Exception):
        acc = accelerator()
        if acc._name != "cpu":
            acc.reset_peak_memory_stats()


def run_one(ctx, name):
    started = time.monotonic()
    reset_peak(ctx)
    status, reason, details = "pass", "", {}
    try:
        details = CHECKS[name](ctx) or {}
    except SkipCheck as exc:
        status, reason = "skip", str(exc)
    except CheckFailed as exc:
        status, reason, details = "fail", str(exc), exc.details
    except Exception as exc:
        status, reason = "fail", f"{type(exc).__name__}: {exc}".strip()
        details = {"traceback": traceback.format_exc(limit=6)[-4000:]}
    return {"event": "result", "check": name, "rank": ctx.rank, "status": status, "reason": reason,
            "duration_s": round(time.monotonic() - started, 4), "details": details,
            "peak_memory_bytes": peak_memory(ctx),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


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


def write_summary(ctx, log):
    """Rank 0 gathers every rank's results, so ranks on other nodes are reported too."""
    torch = ctx.torch
    if torch is None or not torch.distributed.is_initialized():
        return
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, log.records)
    if ctx.rank == 0:
        summary = {"protocol": PROTOCOL_VERSION, "world_size": ctx.world_size,
                   "ranks": {str(r): recs for r, recs in enumerate(gathered)}}
        tmp = ctx.out_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, default=str), encoding="utf-8")
        tmp.replace(ctx.out_dir / "summary.json")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", required=True, help="comma-separated check names, run in this order")
    parser.add_argument("--out", required=True, help="directory for the per-rank result files")
    parser.add_argument("--receipt", default="",
                        help="receipt path (default: <sys.prefix>/share/mlstack-ds/receipt.json)")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective time-out, seconds")
    parser.add_argument("--allow-jit", action="store_true", help="let DeepSpeed JIT-compile missing ops")
    parser.add_argument("--run-id", default="", help="marker that identifies this launch's processes")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    log = ResultLog(args.out, rank)
    log.write({"event": "hello", "rank": rank, "world_size": world_size, "pid": os.getpid(),
               "protocol": PROTOCOL_VERSION, "host": os.uname().nodename})
    fault = parse_fault(os.environ.get("MLSTACK_VERIFY_TEST_FAULT", ""), rank)
    ctx = Context(args, rank, world_size)
    import_targets(ctx, args.allow_jit)
    init_distributed(ctx, args.timeout)
    names = [n for n in args.checks.split(",") if n]
    for index, name in enumerate(names):
        log.write({"event": "start", "check": name, "rank": rank})
        fire_fault(fault, name, index == 0)
        if name not in CHECKS:
            record = {"event": "result", "check": name, "rank": rank, "status": "fail",
                      "reason": "unknown check (worker and tool versions differ?)", "duration_s": 0.0,
                      "details": {}, "peak_memory_bytes": None, "peak_rss_bytes": None}
        else:
            record = run_one(ctx, name)
        log.write(record)
    write_summary(ctx, log)
    if ctx.torch is not None and ctx.torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            ctx.torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks of the installation itself: versions, accelerator, archs, the receipt, the prebuilt ops."""

from __future__ import annotations

import importlib.util
import sys
import time

from .context import accelerator
from .gpu_targets import UNKNOWN, coverage, device_targets
from .protocol import Check, CheckFailed, JitBuildRefused


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
        problems.extend(compare_archs(details, [str(a) for a in receipt.get("archs") or []]))
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
    """What each GPU is (`gfx90a:sramecc+:xnack-` on ROCm, `9.0` on CUDA): the terms the receipt's targets use."""
    if acc._name != "cuda":
        return []
    return device_targets(torch)


def compare_archs(details, built):
    """Record in `details` how the built targets run on each GPU; the problems, one per GPU target left out.
    Targets against targets (gpu_targets), never a device's name: a CUDA torch puts the name in gcnArchName."""
    devices = [target for target in details["archs"] if target != UNKNOWN]
    details["built_archs"] = built
    if not details["archs"]:
        return []
    if not built:
        details["arch_note"] = "the receipt names no GPU targets (the build's defaults): not compared"
        return []
    if len(devices) < len(details["archs"]):
        details["arch_note"] = "torch does not report the target of some GPUs (no gcnArchName): not compared"
    details["arch_coverage"] = ways = coverage(built, devices)
    return [f"GPU target {device} has no code in this install (built for {', '.join(built)})"
            for device, how in ways.items() if how is None]


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


CHECKS = (
    Check("environment", "accelerator, devices and archs, DeepSpeed and torch versions, receipt",
          ("torch", "deepspeed"), check_environment),
    Check("prebuilt_ops", "the ops built ahead of time load without JIT compilation", ("deepspeed",),
          check_prebuilt_ops),
)

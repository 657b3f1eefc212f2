"""The check table: every check `verify` knows, what it needs, whether it runs by default, and which
launch it shares.

Checks in the same `launch` group run in one `torch.distributed.run` launch (start-up and process-group
set-up are paid once). A check that must not share a process with the others (for instance if several
ZeRO-3 engines in one process turn out to be unsafe) gets its own group name here; nothing else
changes. `--isolate` puts every check in its own launch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mlstack_ds.errors import UsageError

SHARED_LAUNCH = "shared"


@dataclass(frozen=True)
class CheckSpec:
    name: str
    summary: str
    needs: tuple[str, ...]  # what the check exercises: "torch", "deepspeed", "distributed", "op:<name>"
    default: bool = True
    launch: str = SHARED_LAUNCH


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("environment", "accelerator, devices and archs, DeepSpeed and torch versions, receipt",
              ("torch", "deepspeed")),
    CheckSpec("prebuilt_ops", "the ops built ahead of time load without JIT compilation",
              ("deepspeed",)),
    CheckSpec("fused_adam", "FusedAdam matches torch.optim.AdamW over 10 steps",
              ("deepspeed", "op:fused_adam")),
    CheckSpec("cpu_adam", "DeepSpeedCPUAdam matches torch.optim.AdamW over 10 steps",
              ("deepspeed", "op:cpu_adam")),
    CheckSpec("fused_lamb", "FusedLamb, where built (skipped otherwise)", ("deepspeed", "op:fused_lamb")),
    CheckSpec("fused_lion", "FusedLion, where built (skipped otherwise)", ("deepspeed", "op:fused_lion")),
    CheckSpec("zero1", "ZeRO-1 training matches a torch AdamW copy; optimizer state partitioned",
              ("deepspeed", "distributed")),
    CheckSpec("zero2", "ZeRO-2 training matches a torch AdamW copy; optimizer state partitioned",
              ("deepspeed", "distributed")),
    CheckSpec("zero3", "ZeRO-3 training matches a torch AdamW copy; parameters partitioned ~1/N",
              ("deepspeed", "distributed")),
    CheckSpec("zero2_offload", "ZeRO-2 with the optimizer offloaded to CPU (cpu_adam)",
              ("deepspeed", "distributed", "op:cpu_adam")),
    CheckSpec("zero3_offload", "ZeRO-3 with optimizer and parameters offloaded to CPU",
              ("deepspeed", "distributed", "op:cpu_adam")),
    CheckSpec("precision", "bf16 / fp16 training where the device supports it", ("deepspeed", "distributed")),
    CheckSpec("checkpoint", "ZeRO-3 save and load round trip; identical weights, training continues",
              ("deepspeed", "distributed")),
    CheckSpec("amd_specific", "the patched `amd_specific` config section (skipped on unpatched builds)",
              ("deepspeed",)),
)

CHECK_NAMES: tuple[str, ...] = tuple(spec.name for spec in CHECKS)


def _parse_names(value: str | Iterable[str] | None, option: str) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [item.strip() for part in items for item in part.split(",") if item.strip()]
    if not names:  # `--only ,` must not quietly mean "the defaults"
        raise UsageError(f"{option}: no check named", hint=f"known checks: {', '.join(CHECK_NAMES)}")
    unknown = [n for n in names if n not in CHECK_NAMES]
    if unknown:
        raise UsageError(f"{option}: unknown check(s) {', '.join(unknown)}",
                         hint=f"known checks: {', '.join(CHECK_NAMES)}")
    return names


def select_checks(only: str | Sequence[str] | None = None,
                  skip: str | Sequence[str] | None = None) -> tuple[CheckSpec, ...]:
    """The checks to run, in table order: `--only` (else the defaults) minus `--skip`."""
    wanted = set(_parse_names(only, "--only")) or {s.name for s in CHECKS if s.default}
    dropped = set(_parse_names(skip, "--skip"))
    chosen = tuple(s for s in CHECKS if s.name in wanted and s.name not in dropped)
    if not chosen:
        raise UsageError("no checks left to run", hint="--skip removed every check that --only selected")
    return chosen


def launch_groups(specs: Sequence[CheckSpec], isolate: bool = False) -> list[tuple[CheckSpec, ...]]:
    """Partition checks into launches, keeping table order within and across groups."""
    if isolate:
        return [(spec,) for spec in specs]
    groups: dict[str, list[CheckSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.launch, []).append(spec)
    return [tuple(group) for group in groups.values()]

"""The check table: every check `verify` knows, what it needs, whether it runs by default, and which
launch it shares.

The checks themselves, and their table, live in the worker package (`mlstack_ds/worker/`), which
runs in the target interpreter; this module is the tool's view of that table.

Checks in the same `launch` group run in one `torch.distributed.run` launch (start-up and process-group
set-up are paid once). A check that must not share a process with the others (for instance if several
ZeRO-3 engines in one process turn out to be unsafe) gets its own group name in its `Check` row;
nothing else changes. `--isolate` puts every check in its own launch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mlstack_ds.errors import UsageError
from mlstack_ds.worker import registry as worker_registry

SHARED_LAUNCH = "shared"


@dataclass(frozen=True)
class CheckSpec:
    name: str
    summary: str
    needs: tuple[str, ...]  # what the check exercises: "torch", "deepspeed", "distributed", "op:<name>", "pkg:<name>"
    default: bool = True
    launch: str = SHARED_LAUNCH


# The worker's own table (mlstack_ds/worker/registry.py) is the one place a check is declared;
# the tool reads it here without running anything (the worker imports torch and deepspeed lazily).
CHECKS: tuple[CheckSpec, ...] = tuple(
    CheckSpec(c.name, c.summary, tuple(c.needs), c.default, c.launch) for c in worker_registry.all_checks())

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

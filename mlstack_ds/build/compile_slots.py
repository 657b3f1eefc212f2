"""At most `--jobs` compiles at a time, through ccache's prefix command: each compile that ccache runs (and
its preprocessor run) first takes one of `jobs` slots (target_side/mlstack_compile_slot.py).

Why: the plan lets up to twice `--jobs` compiler processes exist (plan/buildjobs.py: an op left alone at the
end keeps every core). While all ops run, that was four compilers on two cores, and a compile then took more
CPU than alone: in a cold build of the full CPU plan (2026-11-29, strace), 95 s with four compiles at once
and 74 s with three, shm.cpp and shm_interface.cpp at 25.9 and 26.7 s of CPU against 21.2 s alone; with two
slots the same build's compiles took 318.0 s of CPU instead of 368.8 s, and the build 207.0 s instead of
217.5 s (issue 43, docs/benchmarks.md). ninja still starts its share of jobs: the ones without a slot wait,
and an op left alone takes every slot the others gave back.

Only where ccache runs the compiles (the plan puts its directory first on PATH) and the user names no
prefix command of their own (`CCACHE_PREFIX`, say distcc, sends compiles to other machines).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.target_side import mlstack_compile_slot as compile_slot
from mlstack_ds.target_side import runnable_copy

USER_PREFIXES = ("CCACHE_PREFIX", "CCACHE_PREFIX_CPP")


def slot_count(plan: BuildPlan) -> int:
    """Compiles at a time: the budget, in compile commands (on ROCm each runs `archs_at_once` processes).
    0: no slots, because the plan never runs more compiler processes than that."""
    concurrency = plan.concurrency
    if concurrency is None:
        return 0
    slots = max(1, concurrency.jobs // concurrency.archs_at_once)
    return slots if concurrency.processes > slots * concurrency.archs_at_once else 0


def compile_slot_env(plan: BuildPlan, staging: Path, base_env: Mapping[str, str]) -> dict[str, str]:
    """The variables that make ccache take a slot for each compile (none where slots do not apply); the
    slot files and the prefix command are made under `staging`."""
    count = slot_count(plan)
    if not count or not plan.path_prepend or any(base_env.get(name) for name in USER_PREFIXES):
        return {}
    prefix = runnable_copy(compile_slot, staging / "compile-slot" / "mlstack-compile-slot", plan.target_python)
    if prefix is None:
        return {}
    slots = staging / "compile-slots"
    slots.mkdir(exist_ok=True)
    for index in range(count):
        (slots / f"slot-{index}").touch()
    return {"CCACHE_PREFIX": str(prefix), "CCACHE_PREFIX_CPP": str(prefix), compile_slot.SLOTS: str(slots)}

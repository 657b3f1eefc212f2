"""The check table, in run order: each family module's `CHECKS`, families in the order below.

The tool builds its own table (`mlstack_ds/verify/checks.py`) from this one, so a check is added in one
place: its function and its `Check` row in the family module. A new family is one more import here.
"""

from __future__ import annotations

from . import (
    accelerate_checks,
    adapter_checks,
    comm_checks,
    config_checks,
    env_checks,
    hf_checks,
    kernel_checks,
    lightning_checks,
    optimizer_checks,
    pipeline_checks,
    zero_checks,
)
from .protocol import Check

FAMILIES = (env_checks, optimizer_checks, kernel_checks, comm_checks, zero_checks, adapter_checks, pipeline_checks,
            hf_checks, accelerate_checks, lightning_checks, config_checks)


def all_checks() -> tuple[Check, ...]:
    return tuple(check for family in FAMILIES for check in family.CHECKS)


def by_name() -> dict[str, Check]:
    return {check.name: check for check in all_checks()}

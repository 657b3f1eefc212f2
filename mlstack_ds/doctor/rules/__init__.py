"""The rule registry: every rule, in a stable order, checked for unique well-formed ids."""

from __future__ import annotations

from mlstack_ds.doctor.model import RULE_ID_RE, Rule
from mlstack_ds.doctor.rules import (
    build_rules,
    bundle_rules,
    client_rules,
    cluster_rules,
    deepspeed_rules,
    device_rules,
    env_rules,
    jit_rules,
    launch_rules,
    log_rules,
    slurm_rules,
    system_rules,
    torch_rules,
    variable_rules,
    wheel_rules,
)


def _registry(*groups: tuple[Rule, ...]) -> tuple[Rule, ...]:
    rules = tuple(rule for group in groups for rule in group)
    seen: set[str] = set()
    for rule in rules:
        if not RULE_ID_RE.match(rule.id) or rule.id in seen:
            raise ValueError(f"rule id {rule.id!r} is malformed or used twice")
        if rule.check is None and rule.cluster_check is None and not rule.log_patterns:
            raise ValueError(f"rule {rule.id} can never fire: no check and no log pattern")
        seen.add(rule.id)
    return rules


RULES: tuple[Rule, ...] = _registry(
    torch_rules.RULES,
    device_rules.RULES,
    env_rules.RULES,
    wheel_rules.RULES,
    variable_rules.RULES,
    build_rules.RULES,
    bundle_rules.RULES,
    jit_rules.RULES,
    deepspeed_rules.RULES,
    client_rules.RULES,
    system_rules.RULES,
    launch_rules.RULES,
    log_rules.RULES,
    cluster_rules.RULES,
    slurm_rules.RULES,
)


def rule_by_id(rule_id: str) -> Rule:
    for rule in RULES:
        if rule.id == rule_id:
            return rule
    raise KeyError(rule_id)

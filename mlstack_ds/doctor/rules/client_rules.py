"""Client library versions known to fail with the installed DeepSpeed: one rule per pair of
`detect/known_bad_clients.toml`, so a new pair is data, not code."""

from __future__ import annotations

from typing import cast

from mlstack_ds.detect.client_pairs import BadPair, known_bad_pairs
from mlstack_ds.doctor.model import Check, DoctorInput, Hit, Rule, Severity


def pair_check(pair: BadPair) -> Check:
    """The rule's check: the target's client and DeepSpeed versions against the pair."""

    def check(inp: DoctorInput) -> Hit | None:
        clients = dict(inp.facts.clients)
        ds = inp.env.deepspeed.version if inp.env.deepspeed else None
        if not pair.applies(clients.get(pair.client), ds, inp.facts.receipt_patches):
            return None
        patched = "" if not pair.fixed_by_patch else f", built without {pair.fixed_by_patch}"
        return Hit(f"{pair.client} {clients[pair.client]} (fails: {pair.client_versions}) with DeepSpeed {ds} "
                   f"(fails: {pair.deepspeed}{patched})")

    return check


def pair_rule(pair: BadPair) -> Rule:
    return Rule(id=pair.id, severity=cast(Severity, pair.severity), title=pair.title, symptom=pair.symptom,
                fix=pair.fix, source=pair.evidence, check=pair_check(pair), log_patterns=(pair.log_pattern,))


RULES: tuple[Rule, ...] = tuple(pair_rule(pair) for pair in known_bad_pairs())

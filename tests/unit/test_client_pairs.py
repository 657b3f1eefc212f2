"""Known bad client/DeepSpeed pairs (detect/known_bad_clients.toml): the shipped data loads, each pair applies
exactly to its version ranges unless our patch is in, and verify names the pair beside a failure carrying its
error text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlstack_ds.detect.client_pairs import known_bad_pairs, known_cause, load_pairs
from mlstack_ds.doctor.rules import rule_by_id
from mlstack_ds.verify.report import CheckResult, with_known_cause

# The error both ranks printed with transformers 5.17.0 on DeepSpeed 0.19.5 (verify --only hf_trainer, issue 40).
WARMUP_FAILURE = "ranks 0,1: ValueError: warmup_num_steps must be a positive integer, got 0"


def warmup_pair():
    return next(p for p in known_bad_pairs() if p.id == "MLS-DS-101")


def test_the_shipped_pairs_load_and_each_is_a_doctor_rule_with_its_evidence() -> None:
    pairs = known_bad_pairs()
    assert pairs and len({p.id for p in pairs}) == len(pairs)
    for pair in pairs:
        rule = rule_by_id(pair.id)
        assert rule.source == pair.evidence and rule.fix == pair.fix and rule.log_patterns == (pair.log_pattern,)


def test_docs_list_every_known_bad_pair_and_every_client_pin() -> None:
    """docs/verify.md's client tables name each shipped pair with its ranges and each pinned client version."""
    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "verify.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in docs.splitlines() if line.startswith("| MLS-DS-")}
    for pair in known_bad_pairs():
        row = rows.pop(pair.id)
        assert f"| {pair.client} " in row, row
    assert not rows, f"docs/verify.md lists pairs that are not shipped: {sorted(rows)}"
    pins = [line.split("#")[0].strip() for line in (root / "requirements" / "clients.txt").read_text().splitlines()]
    for name, version in (pin.split("==") for pin in pins if pin):
        assert f"{name} {version}" in docs, (name, version)


@pytest.mark.parametrize(("client", "deepspeed", "patches", "applies"), [
    ("5.17.0", "0.19.5", (), True),
    ("5.17.0", "0.19.8", (), True),
    ("5.17.0", "0.19.3", (), True),  # PR #8126's first release
    ("5.17.0", "0.19.5+b889ffa", (), True),  # a local build of 0.19.5
    ("4.57.1", "0.19.5", (), True),
    ("5.18.0", "0.19.5", (), False),  # passes max(1, warmup_steps)
    ("5.23.0", "0.19.8", (), False),
    ("5.17.0", "0.19.2", (), False),  # accepted 0 (max(2, n))
    ("5.17.0", "0.19.5", ("0023-lr_schedules-accept-warmup_num_steps-0-again.patch",), False),
    (None, "0.19.5", (), False),
    ("5.17.0", None, (), False),
    ("not-a-version", "0.19.5", (), False),
])
def test_the_warmup_pair_applies_to_its_ranges(client, deepspeed, patches, applies) -> None:
    assert warmup_pair().applies(client, deepspeed, patches) is applies


def test_its_log_pattern_matches_the_real_error_only_for_zero() -> None:
    pair = warmup_pair()
    assert pair.log_pattern.search(WARMUP_FAILURE)
    assert not pair.log_pattern.search("ValueError: warmup_num_steps must be a positive integer, got 05")
    assert known_cause(WARMUP_FAILURE, known_bad_pairs()) == pair
    assert known_cause("RuntimeError: something else", known_bad_pairs()) is None


def test_verify_names_the_known_cause_beside_a_failure_and_nowhere_else() -> None:
    pairs = known_bad_pairs()
    failed = with_known_cause(CheckResult("hf_trainer", "fail", WARMUP_FAILURE, 1.0), pairs)
    assert failed.reason.startswith(WARMUP_FAILURE)
    assert re.search(r"\[known cause MLS-DS-101: .*; fix: pip install 'transformers>=5.18'\]$", failed.reason)
    skipped = CheckResult("hf_trainer", "skip", WARMUP_FAILURE, 0.0)
    assert with_known_cause(skipped, pairs) is skipped


@pytest.mark.parametrize(("field", "value", "said"), [
    ("client_versions", "<<5", "MLS-DS-999"),
    ("log_pattern", "(", "MLS-DS-999"),
    ("severity", "fatal", "severity 'fatal'"),
])
def test_a_malformed_entry_is_refused_by_name(field: str, value: str, said: str) -> None:
    entry = {"id": "MLS-DS-999", "client": "x", "client_versions": "<1", "deepspeed": ">=0", "severity": "error",
             "title": "t", "symptom": "s", "log_pattern": "e", "fix": ["f"], "evidence": "v", field: value}
    text = "[[pair]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items())  # JSON's are TOML's
    with pytest.raises(ValueError, match=re.escape(said)):
        load_pairs(text)

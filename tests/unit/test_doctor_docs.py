"""docs/troubleshooting.md is generated from the rule registry; the two must not drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlstack_ds.doctor import docs
from mlstack_ds.doctor.model import RULE_ID_RE
from mlstack_ds.doctor.rules import RULES

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "troubleshooting.md"


def test_committed_page_equals_the_generated_one() -> None:
    assert PAGE.read_text(encoding="utf-8") == docs.render(), (
        "regenerate it: python -m mlstack_ds.doctor.docs > docs/troubleshooting.md"
    )


def test_module_entry_point_prints_the_page() -> None:
    result = subprocess.run([sys.executable, "-m", "mlstack_ds.doctor.docs"], capture_output=True, text=True,
                            check=True)
    assert result.stdout == docs.render()


def test_page_lists_every_rule_with_its_anchor_symptom_and_fix() -> None:
    page = docs.render()
    for rule in RULES:
        assert f'<a id="{rule.id.lower()}"></a>' in page
        assert f"### {rule.id}: {rule.title}" in page
        assert rule.symptom in page
        assert all(step in page for step in rule.fix)


def test_rule_ids_are_well_formed_unique_and_sourced() -> None:
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids))
    assert all(RULE_ID_RE.match(i) for i in ids)
    assert all(rule.source and rule.symptom and rule.fix for rule in RULES)

"""docs/rocm-ops.md and each pin's ROCm build table say the same thing about every op.

The doc has the default pin's full table, then the rows the second pin changes ("we build" `removed`
for an op the release no longer has)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.plan import buildspec
from mlstack_ds.recipe import find_recipe

DOC = Path(__file__).resolve().parents[2] / "docs" / "rocm-ops.md"
SECOND_PIN_SECTION = "## DeepSpeed 0.19.8: the rows that change"


def doc_table(text: str) -> dict[str, tuple[str, bool | None]]:
    """op -> (flag, built ahead of time), None for an op the release removed."""
    rows: dict[str, tuple[str, bool | None]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].startswith("DS_BUILD_"):
            rows[cells[0]] = (cells[1], None if cells[4] == "removed" else cells[4].startswith("**yes"))
    return rows


def recipe_table(name: str) -> dict[str, tuple[str, bool | None]]:
    recipe = find_recipe(name)
    table = buildspec.parse_platform("rocm", recipe.platforms["rocm"], str(recipe.path))
    return {op.name: (op.flag, op.build) for op in table.ops}


def documented(name: str) -> dict[str, tuple[str, bool | None]]:
    default_part, _, second_part = DOC.read_text().partition(SECOND_PIN_SECTION)
    table = doc_table(default_part)
    if name == "deepspeed-0.19.8":
        table.update(doc_table(second_part.split("\n## ", 1)[0]))
    return {op: row for op, row in table.items() if row[1] is not None}


@pytest.mark.parametrize("name", ["deepspeed-0.19.5", "deepspeed-0.19.8"])
def test_every_rocm_op_of_the_recipe_is_in_the_doc_with_the_same_decision(name: str) -> None:
    assert documented(name) == recipe_table(name)


def test_the_second_pin_section_is_there() -> None:
    """Without it the 0.19.8 comparison above would silently compare 0.19.5's table."""
    assert SECOND_PIN_SECTION in DOC.read_text()
    assert "sparse_attn" not in recipe_table("deepspeed-0.19.8")

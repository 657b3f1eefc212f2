"""docs/rocm-ops.md and the recipe's ROCm build table say the same thing about every op."""

from __future__ import annotations

from pathlib import Path

from mlstack_ds import buildspec
from mlstack_ds.recipe import find_recipe

DOC = Path(__file__).resolve().parents[2] / "docs" / "rocm-ops.md"


def doc_table() -> dict[str, tuple[str, bool]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].startswith("DS_BUILD_"):
            rows[cells[0]] = (cells[1], cells[4].startswith("**yes"))
    return rows


def test_every_rocm_op_of_the_recipe_is_in_the_doc_with_the_same_decision() -> None:
    recipe = find_recipe("deepspeed-0.19.5")
    table = buildspec.parse_platform("rocm", recipe.platforms["rocm"], str(recipe.path))
    from_recipe = {op.name: (op.flag, op.build) for op in table.ops}
    assert doc_table() == from_recipe

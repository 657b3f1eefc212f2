"""No op we build stays without a check (issue 39): every op a recipe builds on any platform is computed
against a reference by some check, or is one of the few `untested_ops` names in a skip. A new op in a recipe
fails here until it has a check; a new numerical test must take its op off that list."""

from __future__ import annotations

import pytest

from mlstack_ds import tomlcompat
from mlstack_ds.resources import data_dir
from mlstack_ds.worker import kernel_checks
from mlstack_ds.worker.registry import all_checks

RECIPES = sorted(data_dir("recipes").glob("deepspeed-*.toml"))


def built_ops() -> set[str]:
    ops = set()
    for path in RECIPES:
        recipe = tomlcompat.loads(path.read_text(encoding="utf-8"))
        for table in recipe["platforms"].values():
            ops |= {name for name, op in table["ops"].items() if op.get("build")}
    return ops


def ops_with_a_check() -> set[str]:
    """Ops named by a check other than untested_ops."""
    return {need.removeprefix("op:") for check in all_checks() if check.name != "untested_ops"
            for need in check.needs if need.startswith("op:")}


def test_there_are_recipes_and_ops() -> None:
    assert len(RECIPES) >= 2 and {"fused_lamb", "fused_lion", "cpu_adam"} <= built_ops()


def test_every_built_op_has_a_numerical_check_or_is_named_untested() -> None:
    untested = built_ops() - ops_with_a_check()
    assert untested == set(kernel_checks.OPS_WITHOUT_NUMERICAL_TEST), (
        "ops a recipe builds without a check: add a check, or (for now) name them in OPS_WITHOUT_NUMERICAL_TEST")


@pytest.mark.parametrize("op", ["fused_lamb", "fused_lion", "cpu_adagrad", "cpu_lion", "quantizer", "utils",
                                "random_ltd"])
def test_the_ops_built_for_rocm_have_their_own_check(op: str) -> None:
    assert op in ops_with_a_check()

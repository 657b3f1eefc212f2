"""Per-platform build tables: the shipped ones are valid, broken ones are refused naming the key."""

from __future__ import annotations

import pytest

from mlstack_ds.errors import UsageError
from mlstack_ds.plan.buildspec import parse_platform
from mlstack_ds.recipe import list_recipes


def test_shipped_tables_are_valid_and_every_op_has_a_reason() -> None:
    for recipe in list_recipes():
        assert set(recipe.platforms) == {"rocm", "cuda", "cpu"}
        for name, table in recipe.platforms.items():
            build = parse_platform(name, table, str(recipe.path))
            assert build.accelerator == ("cpu" if name == "cpu" else "cuda")  # never "rocm"
            assert len({op.flag for op in build.ops}) == len(build.ops)
            assert all(op.reason for op in build.ops)


GOOD = {"accelerator": "cuda", "ops": {"fused_adam": {"flag": "DS_BUILD_FUSED_ADAM", "build": True, "reason": "x"}}}


@pytest.mark.parametrize(("table", "key"), [
    ({**GOOD, "acclerator": "cuda"}, "platforms.rocm.acclerator"),
    ({**GOOD, "accelerator": "rocm"}, "platforms.rocm.accelerator"),
    ({**GOOD, "ops": {}}, "platforms.rocm.ops"),
    ({**GOOD, "ops": {"x": {"flag": "BUILD_X", "build": True, "reason": "r"}}}, "platforms.rocm.ops.x.flag"),
    ({**GOOD, "ops": {"x": {"flag": "DS_BUILD_X", "build": "yes", "reason": "r"}}}, "platforms.rocm.ops.x.build"),
    ({**GOOD, "ops": {"x": {"flag": "DS_BUILD_X", "build": True}}}, "platforms.rocm.ops.x.reason"),
    ({**GOOD, "ops": {"x": {"flag": "DS_BUILD_X", "build": True, "reason": "r", "requires": "cutlass"}}},
     "platforms.rocm.ops.x.requires"),
])
def test_broken_tables_name_file_and_key(table: dict, key: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_platform("rocm", table, "recipes/x.toml")
    assert info.value.message.startswith(f"recipes/x.toml: {key} ")

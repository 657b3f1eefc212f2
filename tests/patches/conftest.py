"""Fixtures for the AMD patch tests: DeepSpeed trees of both pins, with and without their series applied.

`patched_tree` applies the shipped series with the product's own engine (tests/conftest.py: patched_trees),
which also patches the sdist's real copies of csrc/ and op_builder/ under deepspeed/ops/. Trees are
session-scoped (copying and patching a DeepSpeed tree costs seconds) and must not be modified by tests;
subprocesses run with PYTHONDONTWRITEBYTECODE.

`ds_tree` runs each patch's tests on both pins. A test module is about one patch (`test_NNNN_*.py`):
where the second pin's series carries that patch, its pristine tree must show the old behaviour and its
patched tree the fix, as on 0.19.5; where the patch was dropped because upstream has it, the second
pin's pristine tree must already behave like the patched 0.19.5 (the evidence that dropping it was right).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.target_env import DS_NEXT_VERSION, DS_VERSION

from mlstack_ds.patches import series_for_recipe
from mlstack_ds.recipe import find_recipe


@pytest.fixture(scope="session")
def patched_tree(patched_trees: Callable[[str], Path]) -> Path:
    """DeepSpeed 0.19.5 with every patch in `series` applied, in order."""
    return patched_trees(DS_VERSION)


@pytest.fixture(scope="session")
def next_patched_tree(patched_trees: Callable[[str], Path]) -> Path:
    """The second pin (0.19.8) with its own series applied."""
    return patched_trees(DS_NEXT_VERSION)


def patch_of_module(module_name: str) -> str:
    """`test_0013_rocm_bucket_defaults` -> `0013`."""
    found = re.match(r"test_(\d{4})_", module_name.rsplit(".", 1)[-1])
    assert found, f"{module_name}: patch tests are named test_NNNN_<what>.py"
    return found.group(1)


def series_has(version: str, number: str) -> bool:
    return any(p.name.startswith(f"{number}-") for p in series_for_recipe(find_recipe(f"deepspeed-{version}")).patches)


TREES = {  # param -> (pin, the tree as shipped or with its series, fixture)
    "pristine": (DS_VERSION, "pristine", "pristine_tree_template"),
    "patched": (DS_VERSION, "patched", "patched_tree"),
    f"pristine-{DS_NEXT_VERSION}": (DS_NEXT_VERSION, "pristine", "next_pristine_tree"),
    f"patched-{DS_NEXT_VERSION}": (DS_NEXT_VERSION, "patched", "next_patched_tree"),
}


@pytest.fixture(scope="module", params=list(TREES))
def ds_tree(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(kind, tree): tests assert the old wrong behaviour where kind is "pristine", the fix where it is
    "patched". On the second pin a patch upstream already has makes its pristine tree "patched"."""
    version, state, fixture = TREES[request.param]
    if version != DS_VERSION and not series_has(version, patch_of_module(request.module.__name__)):
        if state == "patched":
            pytest.skip(f"the {version} series drops this patch: upstream has it (its pristine tree is tested)")
        state = "patched"
    return state, request.getfixturevalue(fixture)

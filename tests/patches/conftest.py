"""Fixtures for the AMD patch tests: DeepSpeed 0.19.5 trees with and without the series applied.

`patched_tree` applies the shipped series with the product's own engine (`mlstack_ds.patches`), which
also patches the sdist's real copies of csrc/ and op_builder/ under deepspeed/ops/. Trees are
session-scoped (copying and patching a DeepSpeed tree costs seconds) and must not be modified by tests;
subprocesses run with PYTHONDONTWRITEBYTECODE.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.recipe import find_recipe


@pytest.fixture(scope="session")
def patched_tree(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSpeed 0.19.5 with every patch in `series` applied, in order."""
    tree = tmp_path_factory.mktemp("ds-patched") / pristine_tree_template.name
    shutil.copytree(pristine_tree_template, tree, symlinks=True)
    apply_series(tree, series_for_recipe(find_recipe("deepspeed-0.19.5")))
    return tree


@pytest.fixture(scope="session", params=["pristine", "patched"])
def ds_tree(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(kind, tree) for both trees: tests assert the old wrong behaviour on pristine, the fix on patched."""
    fixture = "pristine_tree_template" if request.param == "pristine" else "patched_tree"
    return request.param, request.getfixturevalue(fixture)

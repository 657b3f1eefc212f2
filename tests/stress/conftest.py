"""Session fixtures for the ZeRO-3 race test: pristine and patched DeepSpeed 0.19.5 source trees, and the
second pin (0.19.8) unpatched: upstream fixed the race there (our backports 0001-0003 reverse-apply).

Both are imported from source (PYTHONPATH) by the test venv's interpreter, so CI never pip-installs
DeepSpeed twice. The patched tree gets the shipped series through the tool's own patch engine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.recipe import find_recipe


@pytest.fixture(scope="session")
def pristine_deepspeed_tree(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the unpatched tree (importing it writes __pycache__, so never the template)."""
    tree = tmp_path_factory.mktemp("ds-unpatched") / "deepspeed-0.19.5"
    shutil.copytree(pristine_tree_template, tree, symlinks=True)
    return tree


@pytest.fixture(scope="session")
def patched_deepspeed_tree(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree with every patch in the series applied, in order."""
    tree = tmp_path_factory.mktemp("ds-patched") / "deepspeed-0.19.5"
    shutil.copytree(pristine_tree_template, tree, symlinks=True)
    apply_series(tree, series_for_recipe(find_recipe("deepspeed-0.19.5")))
    return tree


@pytest.fixture(scope="session")
def next_unpatched_deepspeed_tree(next_pristine_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the second pin's tree, with no patch at all."""
    tree = tmp_path_factory.mktemp("ds-next-unpatched") / next_pristine_tree.name
    shutil.copytree(next_pristine_tree, tree, symlinks=True)
    return tree

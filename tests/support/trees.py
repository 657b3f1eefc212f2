"""DeepSpeed source trees for the tests: a pin's pristine tree (the sdist as a one-commit git repo, made by
tests/conftest.py) and `patched_tree`, a copy of it with that pin's shipped series applied by the product's
own patch engine (`mlstack_ds.patches`), which also patches the sdist's copies of csrc/ and op_builder/
under deepspeed/ops/."""

from __future__ import annotations

import shutil
from pathlib import Path

from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.recipe import find_recipe


def copied_tree(template: Path, dest_dir: Path) -> Path:
    """A copy of `template` in `dest_dir` (same name): tests that import from a tree write __pycache__ into
    it, so they get their own copy, never the template."""
    tree = dest_dir / template.name
    shutil.copytree(template, tree, symlinks=True)
    return tree


def patched_tree(pristine: Path, version: str, dest_dir: Path) -> Path:
    """A copy of pin `version`'s `pristine` tree in `dest_dir` with every patch of its series applied, in
    order (recipes/deepspeed-VERSION.toml names the series)."""
    tree = copied_tree(pristine, dest_dir)
    apply_series(tree, series_for_recipe(find_recipe(f"deepspeed-{version}")))
    return tree

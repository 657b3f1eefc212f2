"""Fixtures for the AMD patch tests: DeepSpeed 0.19.5 trees with and without the series applied.

`patched_tree` is the ONE place that applies the series; it uses plain `git apply` until the patch
engine exists, then switches to it here. Trees are session-scoped (copying and patching a DeepSpeed
tree costs seconds) and must not be modified by tests; subprocesses run with PYTHONDONTWRITEBYTECODE.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ds_patch_helpers import series_patches

# The sdist ships real copies of csrc/ and op_builder/ under deepspeed/ops/ (the git tag has symlinks
# there); patches name the top-level paths, so an sdist tree gets the same hunks applied to the copies.
SDIST_MIRRORED_DIRS = ("csrc", "op_builder")


def apply_series(tree: Path) -> None:
    ops = tree / "deepspeed" / "ops"
    sdist_copies = [d for d in SDIST_MIRRORED_DIRS if (ops / d).is_dir() and not (ops / d).is_symlink()]
    for patch in series_patches():
        subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=tree, check=True)
        text = patch.read_text()
        mirrored = [d for d in sdist_copies if f"\n+++ b/{d}/" in text]
        if mirrored:
            subprocess.run(["git", "apply", "--whitespace=nowarn", "--directory=deepspeed/ops",
                            *(f"--include=deepspeed/ops/{d}/*" for d in mirrored), str(patch)],
                           cwd=tree, check=True)


@pytest.fixture(scope="session")
def patched_tree(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSpeed 0.19.5 with every patch in `series` applied, in order."""
    tree = tmp_path_factory.mktemp("ds-patched") / pristine_tree_template.name
    shutil.copytree(pristine_tree_template, tree, symlinks=True)
    apply_series(tree)
    return tree


@pytest.fixture(scope="session", params=["pristine", "patched"])
def ds_tree(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(kind, tree) for both trees: tests assert the old wrong behaviour on pristine, the fix on patched."""
    fixture = "pristine_tree_template" if request.param == "pristine" else "patched_tree"
    return request.param, request.getfixturevalue(fixture)

"""Session fixtures for the ZeRO-3 race test: pristine and patched DeepSpeed 0.19.5 source trees.

Both are imported from source (PYTHONPATH) by the test venv's interpreter, so CI never pip-installs
DeepSpeed twice. The patched tree gets the shipped series with plain `git apply` (to be replaced by
the tool's apply engine once it exists).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERIES_DIR = REPO_ROOT / "patches" / "deepspeed-0.19.5"


def series_patches() -> list[Path]:
    names = [line.strip() for line in (SERIES_DIR / "series").read_text().splitlines()]
    return [SERIES_DIR / name for name in names if name and not name.startswith("#")]


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
    for patch in series_patches():
        subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
    return tree

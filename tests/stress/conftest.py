"""Session fixtures for the ZeRO-3 race test: pristine and patched DeepSpeed 0.19.5 source trees, and the
second pin (0.19.8) unpatched: upstream fixed the race there (our backports 0001-0003 reverse-apply).

Both are imported from source (PYTHONPATH) by the test venv's interpreter, so CI never pip-installs
DeepSpeed twice. The patched tree gets the shipped series through the tool's own patch engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.target_env import DS_VERSION
from support.trees import copied_tree


@pytest.fixture(scope="session")
def pristine_deepspeed_tree(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the unpatched tree (importing it writes __pycache__, so never the template)."""
    return copied_tree(pristine_tree_template, tmp_path_factory.mktemp("ds-unpatched"))


@pytest.fixture(scope="session")
def patched_deepspeed_tree(patched_trees: Callable[[str], Path]) -> Path:
    """A copy of the tree with every patch in the series applied, in order (its own copy: imported from)."""
    return patched_trees(DS_VERSION)


@pytest.fixture(scope="session")
def next_unpatched_deepspeed_tree(next_pristine_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the second pin's tree, with no patch at all."""
    return copied_tree(next_pristine_tree, tmp_path_factory.mktemp("ds-next-unpatched"))

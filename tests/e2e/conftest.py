"""End-to-end fixtures: real target venvs (CPU torch 2.13.0 + DeepSpeed 0.19.5).

`installed_target` (tests/conftest.py) is the product's own install (`mlstack-ds install` from the PyPI sdist,
patched), done once per session in the background and shared by the install, verify and multi-node tests;
its wheel cache (`e2e_cache`) makes later reinstalls take seconds.
`no_ops_venv` is the one other kind of target: DeepSpeed without prebuilt ops, which mlstack-ds never
makes, built by hand in tests/target_env.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from target_env import NO_OPS_FLAGS, TargetVenv, build_target_venv, test_cache_dir


@pytest.fixture(scope="session")
def no_ops_venv(deepspeed_sdist: Path) -> TargetVenv:
    """DeepSpeed installed with DS_BUILD_OPS=0: pure Python, every op would be JIT-compiled."""
    made = build_target_venv(deepspeed_sdist, NO_OPS_FLAGS, test_cache_dir())
    if made.build_seconds:
        sys.stderr.write(f"\n[no_ops_venv] built in {made.build_seconds:.0f} s: {made.root}\n")
    return made


@pytest.fixture(scope="session")
def torch_only_python() -> Path:
    """The test venv's interpreter: pinned torch (scripts/test.sh installs it), no DeepSpeed."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail("the test venv has no torch; scripts/test.sh installs torch==2.13.0 into it")
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.fail("the test venv has DeepSpeed installed; it must not (it is the 'deepspeed missing' case)")
    return Path(sys.executable)

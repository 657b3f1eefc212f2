"""End-to-end fixtures: real target venvs (CPU torch 2.13.0 + DeepSpeed 0.19.5).

`installed_target` is the product's own install (`mlstack-ds install` from the PyPI sdist, patched),
done once per session (started in the background when the session begins: tests/conftest.py) and shared
by the install and verify tests; its wheel cache (`e2e_cache`) makes later reinstalls take seconds.
`no_ops_venv` is the one other kind of target: DeepSpeed without prebuilt ops, which mlstack-ds never
makes, built by hand in tests/target_env.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from cold_install import BackgroundInstall
from e2e_support import Target
from target_env import NO_OPS_FLAGS, TargetVenv, build_target_venv, test_cache_dir


@pytest.fixture(scope="session")
def installed_target(cold_install: BackgroundInstall | None) -> Target:
    """A venv with torch 2.13.0 CPU, transformers and accelerate, and DeepSpeed installed by
    `mlstack-ds install` (cold build), started when the session began (tests/conftest.py)."""
    assert cold_install is not None, "tests/conftest.py starts the cold install for every test that needs it"
    result = cold_install.wait()
    sys.stderr.write(f"\n[installed_target] cold install finished {cold_install.seconds:.0f} s after it started\n")
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["action"] == "installed"
    assert document["verify"]["ok"] is True, document["verify"]  # install runs the whole verify suite
    return cold_install.target


@pytest.fixture(scope="session")
def target_venv(installed_target: Target) -> TargetVenv:
    """The verify tests' view of the installed target: cpu_adam, fused_adam, shm_comm prebuilt."""
    return TargetVenv(installed_target.venv, 0.0)


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

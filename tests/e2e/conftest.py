"""End-to-end fixtures: a fresh target venv with the CPU torch, and mlstack-ds's real install into it.

The install is the product's own (`mlstack-ds install` from the PyPI sdist), done once per session
and shared by the install and verify tests; its wheel cache makes later reinstalls take seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e_support import Target, make_torch_venv


@pytest.fixture(scope="session")
def e2e_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlstack-ds's cache for the session. MLSTACK_E2E_CACHE reuses one between local runs (a warm
    wheel cache turns the cold build into a reinstall); CI leaves it unset and builds for real."""
    reused = os.environ.get("MLSTACK_E2E_CACHE")
    return Path(reused) if reused else tmp_path_factory.mktemp("mlstack-cache")


@pytest.fixture(scope="session")
def installed_target(tmp_path_factory: pytest.TempPathFactory, e2e_cache: Path) -> Target:
    """A venv with torch 2.13.0 CPU and DeepSpeed installed by `mlstack-ds install` (cold build)."""
    target = Target(make_torch_venv(tmp_path_factory.mktemp("target") / "venv"), e2e_cache)
    result = target.install("--json")
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["action"] == "installed"
    return target

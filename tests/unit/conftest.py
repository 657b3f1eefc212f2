"""Fixtures shared by the unit tests."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes a test starts (holders of locks, mappings): killed and reaped afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


@pytest.fixture(scope="session")
def architecture() -> ModuleType:
    """scripts/architecture.py: the declared layers and the docs' module table made from the code."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "architecture.py"
    spec = importlib.util.spec_from_file_location("mlstack_architecture", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

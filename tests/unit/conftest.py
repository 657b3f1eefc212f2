"""Fixtures shared by the unit tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

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

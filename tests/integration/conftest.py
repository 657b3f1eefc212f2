"""Fixtures shared by the integration tests of one directory: the real bundle (a minute to make) is made once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.bundles import make_bundle


@pytest.fixture(scope="session")
def made_bundle(deepspeed_sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One real bundle for this machine's Python and platform and its manifest, shared by the session's tests
    (test_bundle_cli.py, test_wrapper_offline.py): do not modify it; copy it."""
    to = tmp_path_factory.mktemp("bundle") / "bundle"
    done = make_bundle(to, deepspeed_sdist)
    assert done.returncode == 0, done.stderr[-3000:]
    return to, done.json["manifest"]

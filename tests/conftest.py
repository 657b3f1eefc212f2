"""Shared test fixtures: the real DeepSpeed 0.19.5 sdist (downloaded once, cached) and trees made from it.

The sdist comes from the package index through pip, like users get it; it is cached in
`$MLSTACK_TEST_CACHE` (default `<repo>/.cache/test`) so a CI run downloads it once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DS_VERSION = "0.19.5"
DS_SDIST_SHA256 = "8dc5d32604a3c7a713b3d14de482533bd328ffebe716cdafcc3511953fc90cdf"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "mlstack-ds tests",
    "GIT_AUTHOR_EMAIL": "tests@mlstack-ds.invalid",
    "GIT_COMMITTER_NAME": "mlstack-ds tests",
    "GIT_COMMITTER_EMAIL": "tests@mlstack-ds.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def test_cache_dir() -> Path:
    path = Path(os.environ.get("MLSTACK_TEST_CACHE", REPO_ROOT / ".cache" / "test"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def deepspeed_sdist() -> Path:
    """Path to deepspeed-0.19.5.tar.gz from the package index, sha256-checked."""
    cache = test_cache_dir()
    sdist = cache / f"deepspeed-{DS_VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"deepspeed=={DS_VERSION}", "-d", str(cache)],
            check=True,
        )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert digest == DS_SDIST_SHA256, f"cached sdist {sdist} has sha256 {digest}; delete it"
    return sdist


@pytest.fixture(scope="session")
def pristine_tree_template(deepspeed_sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist extracted once per session into a git repo with one commit (do not modify; copy it)."""
    root = tmp_path_factory.mktemp("ds-pristine")
    with tarfile.open(deepspeed_sdist) as tar:
        tar.extractall(root, filter="data")
    tree = root / f"deepspeed-{DS_VERSION}"
    env = {**os.environ, **GIT_IDENTITY}
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                 ["git", "commit", "-q", "-m", f"DeepSpeed {DS_VERSION} sdist"]):
        subprocess.run(argv, cwd=tree, env=env, check=True)
    return tree


@pytest.fixture
def fake_machine(tmp_path: Path):
    """A machine whose ROCm tools are fakes replaying real captures (see tests/fakemachine.py)."""
    from fakemachine import FakeMachine

    return FakeMachine(tmp_path / "machine")


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter with nothing installed (no torch): a fresh venv without pip."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"

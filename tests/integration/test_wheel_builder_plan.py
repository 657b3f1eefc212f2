"""A target whose setuptools cannot build wheels is refused before anything is fetched or built, with the one
command that fixes it; the fix is real (pip from the package index), and then the plan goes through."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.cli import run_cli
from support.target_env import overlay_venv


def test_a_venv_with_ensurepips_setuptools_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A new venv's own setuptools (its Python's ensurepip copy) shadows the newer one it sees behind it (here
    the test venv's, with torch, through a .pth; on a user's machine a system PyTorch's site-packages). Without
    the `wheel` package the build would end in `invalid command 'bdist_wheel'` after the download."""
    venv = overlay_venv(tmp_path / "venv")
    python = venv / "bin" / "python"
    own = subprocess.run([python, "-c", "import setuptools; print(setuptools.__version__)"], capture_output=True,
                         text=True, check=True, timeout=120).stdout.strip()
    assert tuple(int(x) for x in own.split(".")[:2]) < (70, 1), f"this Python's ensurepip bundles setuptools {own}"
    cache = tmp_path / "cache"
    refused = run_cli("install", "--dry-run", "--python", python, "--cache-dir", cache, timeout=900)
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert refused.stderr.splitlines() == [
        f"error: {python} cannot build DeepSpeed's wheel: its setuptools {own} has no bdist_wheel (before "
        "setuptools 70.1 the `wheel` package adds it)",
        f"hint: {python} -m pip install wheel"]
    assert not cache.exists()  # refused before anything was downloaded
    subprocess.run([python, "-m", "pip", "install", "--quiet", "wheel"], check=True, timeout=600)
    planned = run_cli("install", "--dry-run", "--python", python, "--cache-dir", cache, timeout=900)
    assert planned.returncode == 0, planned.stderr[-2000:]

"""scripts/install_deepspeed.sh: the one command users run, on a fresh venv (no build here; see e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import run_wrapper
from support.target_env import bare_venv


@pytest.mark.slow
def test_fresh_venv_without_torch_stops_with_the_fix(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    first = run_wrapper("--venv", str(venv), "--", "--dry-run")
    assert first.returncode == 3, first.stderr[-2000:]
    assert "PyTorch is not installed" in first.stderr and "--with-torch cpu" in first.stderr
    assert "Traceback" not in first.stderr
    assert (venv / "bin" / "mlstack-ds").exists()  # the tool itself is installed
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    second = run_wrapper("--venv", str(venv), "--", "--dry-run")  # re-run reuses the venv
    assert second.returncode == 3 and "creating" not in second.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--with-torch", "rocm"], "only 'cpu' can be installed"),
    (["--venv"], "--venv needs a directory"),
])
def test_bad_arguments(args: list[str], message: str) -> None:
    result = run_wrapper(*args)
    assert result.returncode == 2 and message in result.stderr


def test_with_torch_cpu_refuses_to_shadow_a_rocm_torch(tmp_path: Path) -> None:
    """A ROCm PyTorch cannot be installed here (no GPU build on this machine's index), so a stand-in
    package with ROCm's `torch.version` attributes plays it; the wrapper must stop before installing."""
    venv = bare_venv(tmp_path / "venv", "python3")  # the wrapper's own python3, as the README runs it
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        '__version__ = "2.5.1+rocm6.2"\n\nclass version:\n    hip = "6.2.41133"\n    cuda = None\n')
    result = run_wrapper("--venv", str(venv), "--with-torch", "cpu", "--", "--dry-run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "already sees a rocm PyTorch (2.5.1+rocm6.2)" in result.stderr and "hint:" in result.stderr
    assert not (venv / "bin" / "mlstack-ds").exists()  # nothing was installed

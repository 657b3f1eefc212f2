"""scripts/install_deepspeed.sh: the one command users run, on a fresh venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "scripts" / "install_deepspeed.sh"


def run_wrapper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(WRAPPER), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow
def test_fresh_venv_without_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    first = run_wrapper("--venv", str(venv), "--", "--json")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)  # stdout carries only the JSON document
    assert report["python"]["executable"].startswith(str(venv))
    assert "--with-torch cpu" in first.stderr  # tells the user how to get a torch
    # Re-running reuses the venv and gives the same answer.
    second = run_wrapper("--venv", str(venv), "--", "--json")
    assert second.returncode == 0 and json.loads(second.stdout)["platform"] == report["platform"]
    assert (venv / "pyvenv.cfg").read_text().count("include-system-site-packages = true") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--with-torch", "rocm"], "only 'cpu' can be installed"),
    (["--venv"], "--venv needs a directory"),
])
def test_bad_arguments(args: list[str], message: str) -> None:
    result = run_wrapper(*args)
    assert result.returncode == 2 and message in result.stderr

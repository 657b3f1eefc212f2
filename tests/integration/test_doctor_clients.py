"""doctor names a known bad client/DeepSpeed pair in a real target that has one: DeepSpeed 0.19.5 (no_ops_venv,
no receipt, so none of our patches) with transformers 5.17.0 installed over it, and stays silent with 5.18.0,
the first transformers that passes max(1, warmup_steps)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import run_cli
from support.pins import TORCH_PIN
from support.target_env import overlay_venv


def with_transformers(tmp_path: Path, base_python: str, version: str) -> Path:
    """A venv seeing `base_python`'s packages (torch, DeepSpeed) behind its own transformers `version` (its
    metadata is what doctor reads; --no-deps: nothing of the base is replaced)."""
    venv = overlay_venv(tmp_path / f"tf-{version}", base_python)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", f"transformers=={version}", "-c",
                    "/dev/stdin"], input=TORCH_PIN, text=True, check=True, timeout=600)
    return python


@pytest.mark.parametrize(("version", "named"), [("5.17.0", True), ("5.18.0", False)])
def test_doctor_names_the_warmup_pair(no_ops_venv, tmp_path: Path, version: str, named: bool) -> None:
    python = with_transformers(tmp_path, str(no_ops_venv.python), version)
    result = run_cli("doctor", "--python", python, "--json", timeout=600)
    assert result.returncode in (0, 3), result.stderr[-2000:]
    findings = {f["rule_id"]: f for f in json.loads(result.stdout)["findings"]}
    assert ("MLS-DS-101" in findings) is named, sorted(findings)
    if named:
        finding = findings["MLS-DS-101"]
        assert finding["severity"] == "error" and result.returncode == 3
        assert finding["evidence"].startswith("transformers 5.17.0 (fails: <5.18.0) with DeepSpeed 0.19.5 ")
        assert finding["fix"][0].startswith("pip install 'transformers>=5.18'")

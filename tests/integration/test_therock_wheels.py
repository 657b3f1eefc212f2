"""ROCm as TheRock's Python wheels in the target venv, not activated, with this machine's old system ROCm
(Debian's hipcc/hipconfig, ROCm 5.2, which scripts/test.sh installs) on PATH: the real `detect` and
`install --dry-run` against a stand-in venv laid out as TheRock documents it (mlstack_ds/rehearsal/therock.py;
the real wheels come from AMD's indexes, which this machine cannot reach).

No gfx1201 or gfx1151 rocminfo capture exists in tests/fixtures/real, so the venv's rocminfo replays the
real RX 7900 XTX (gfx1100) capture; the newer targets are exercised through torch's arch list."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.cli import CliResult, run_cli
from support.fakemachine import REAL

from mlstack_ds.rehearsal.therock import DevelState, TheRockVenv, make_therock_venv

RX7900 = REAL / "rocminfo_gfx1100_rocm-issue-3949.txt"
TORCH_ARCHS = "gfx942 gfx950 gfx1100 gfx1101 gfx1151 gfx1200 gfx1201"


def venv(tmp_path: Path, *, devel: DevelState = "expanded", rocm: str = "7.14.0",
         torch: str = "2.14.1+rocm7.14.0", hip: str = "7.14.26054-1f6d7a4b1") -> TheRockVenv:
    return make_therock_venv(tmp_path / "venv", rocm_version=rocm, torch_version=torch, hip_version=hip,
                             arch_flags=TORCH_ARCHS, devices=("gfx1100",), rocminfo=RX7900.read_text(), devel=devel)


def cli(*args: str | Path) -> CliResult:
    return run_cli(*args, env={"ROCM_PATH": "", "ROCM_HOME": "", "PYTORCH_ROCM_ARCH": ""}, columns=200)


def test_detect_reports_the_wheels_rocm_and_gpus_not_the_older_system_rocm(tmp_path: Path) -> None:
    assert shutil.which("hipconfig"), "scripts/test.sh installs Debian's hipcc (ROCm 5.2): the system ROCm here"
    target = venv(tmp_path)
    report = cli("detect", "--json", "--python", target.python).json
    assert report["rocm"] == {"root": str(target.devel_root), "version": "7.14.0", "kind": "wheels",
                              "version_source": "rocm_sdk.__version__ (ROCm wheels in the target)",
                              "raw_version": "7.14.0"}
    assert [g["arch"] for g in report["gpus"]] == ["gfx1100"]  # the venv's own rocminfo, not activated
    assert report["platform"] == "rocm"
    assert report["system_rocm"]["version"] == "5.2" and report["system_rocm"]["kind"] == "system"
    assert any("a system ROCm 5.2 is installed too" in w for w in report["warnings"])
    wheels = report["rocm_wheels"]
    assert (wheels["devel_installed"], wheels["devel_expanded"], wheels["device_targets"]) == (True, True, ["gfx1100"])
    text = cli("detect", "--python", target.python)
    assert "ROCm: 7.14.0 at " in text.stdout and "system ROCm: 5.2" in text.stdout


def test_a_rocm_10_venv_is_rocm_10_not_its_hip_version(tmp_path: Path) -> None:
    target = venv(tmp_path, rocm="10.1.0a20260811", torch="2.13.0+rocm10.1.0a20260811", hip="7.16.26321-abcdef012")
    report = cli("detect", "--json", "--python", target.python).json
    assert report["rocm"]["version"] == "10.1.0a20260811"
    assert report["torch"]["hip"].startswith("7.16")
    text = cli("detect", "--python", target.python).stdout
    assert "ROCm: 10.1.0a20260811" in text and "HIP 7.16" in text


def test_the_plan_builds_against_the_devel_tree(tmp_path: Path) -> None:
    target = venv(tmp_path)
    plan = cli("install", "--dry-run", "--json", "--python", target.python).json["plan"]
    devel = str(target.devel_root)
    assert plan["env"]["ROCM_HOME"] == plan["env"]["ROCM_PATH"] == devel
    assert plan["env"]["PYTORCH_NVCC"].endswith(f"{devel}/bin/hipcc")  # ccache (test.sh installs it), then hipcc
    assert str(target.root / "bin") in plan["path_prepend"]  # the wheels' tools on the build's PATH
    assert plan["rocm_wheels"] == "7.14.0" and plan["archs"] == ["gfx1100"]


@pytest.mark.parametrize(("devel", "says", "fix"), [
    ("absent", "have no development files (rocm[devel])", 'pip install "rocm[devel]==7.14.0"'),
    ("tarball", "installed but not expanded yet", "rocm-sdk init"),
])
def test_a_venv_without_a_usable_devel_tree_is_refused_before_anything_is_fetched(
        tmp_path: Path, devel: DevelState, says: str, fix: str) -> None:
    target = venv(tmp_path, devel=devel)
    result = cli("install", "--dry-run", "--python", target.python, "--cache-dir", tmp_path / "cache")
    assert result.returncode == 3, result.stderr
    result.one_error()
    assert says in result.stderr and fix in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing fetched

"""Patch 0021: in a venv holding ROCm as Python wheels (TheRock's rocm-sdk), JIT op builds take the ROCm
version from `rocm_sdk` and the GPU targets from the wheels' own rocminfo, never a silent wave32.

The fake machine is a real venv (made by `python -m venv`, not activated unless a scenario says so) with
the wheels' layout in its site-packages (`rocm_sdk` with a `__version__`, `_rocm_sdk_core/` with
`.info/version` and a bin/rocminfo replaying a real capture, `_rocm_sdk_devel/`) and a rocminfo trampoline
in its bin/; no /opt/rocm, no rocminfo on PATH (probes/therock_venv_probe.py). DeepSpeed's real OpBuilder
methods run in it. The ROCm release (10.1, "10.1.0a20260811") and its HIP version (7.16) follow
docs/patches.md's 0021 section; the version strings are written here, not captured.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import pytest
from support.ds_patch import FIXTURES, run_python_in_tree

from mlstack_ds.patience import Patience
from mlstack_ds.runner import run

PROBE = Path(__file__).resolve().parent / "probes" / "therock_venv_probe.py"
MI210_HOST = (FIXTURES / "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt").read_text()  # wave64
NO_GPU_HOST = (FIXTURES / "rocminfo_no-gpu-visible_debian-rocminfo-5.2.3.txt").read_text()  # exit status 1
ROCM_SDK_VERSION = "10.1.0a20260811"
TAGGED_TORCH = f"2.14.1+rocm{ROCM_SDK_VERSION}"
UNTAGGED_TORCH = "2.14.0a0+git5e1f2a3"  # a torch built locally against the wheels: no "+rocm" in its version
HIP = "7.16.0"  # ROCm 10.1's HIP version: not the ROCm version
GPU = {"output": MI210_HOST, "status": 0}
NO_GPU = {"output": NO_GPU_HOST, "status": 1}

# name -> ROCM_HOME (which root torch found), venv activated, environment, torch.__version__, rocminfo
SCENARIOS: dict[str, tuple[str, bool, dict[str, str], str, dict]] = {
    # torch >= 2.13 finds _rocm_sdk_core itself (pytorch#180723); the venv is not activated
    "rocm-home-core": ("core", False, {}, TAGGED_TORCH, GPU),
    # ROCM_HOME=$(rocm-sdk path --root), PyTorch CI's recipe; its bin/ here has no rocminfo, the
    # venv's trampoline answers
    "rocm-home-devel": ("devel", False, {}, TAGGED_TORCH, GPU),
    # an activated venv makes `which hipcc` the trampoline, so ROCM_HOME is the venv (pytorch#180211)
    "rocm-home-venv-untagged-torch": ("venv", True, {}, UNTAGGED_TORCH, GPU),
    # a build host (docker build, CI) without a GPU: the wheels' rocminfo exits 1
    "no-gpu-user-arch": ("core", False, {"PYTORCH_ROCM_ARCH": "gfx942"}, TAGGED_TORCH, NO_GPU),
    "no-gpu-no-arch": ("core", False, {}, TAGGED_TORCH, NO_GPU),
}


def make_therock_venv(root: Path) -> tuple[Path, Path]:
    """A venv with the ROCm wheels' layout (docs/patches.md, 0021) and the test interpreter's packages
    (torch) chained in by a .pth file; (venv, its site-packages)."""
    made = run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(root)],
               patience=Patience(120))
    assert made.ok, made.tail()
    site = Path(run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    patience=Patience(60)).stdout.strip())
    chained = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    (site / "zz_test_interpreter.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in chained))
    (site / "rocm_sdk").mkdir()
    (site / "rocm_sdk" / "__init__.py").write_text(f'__version__ = "{ROCM_SDK_VERSION}"\n')
    core = site / "_rocm_sdk_core"
    (core / ".info").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / ".info" / "version").write_text(f"{ROCM_SDK_VERSION}\n")
    (core / "bin").mkdir()  # the probe puts each scenario's rocminfo here
    (site / "_rocm_sdk_devel" / "include").mkdir(parents=True)
    (site / "_rocm_sdk_devel" / "bin").mkdir()
    trampoline = root / "bin" / "rocminfo"  # the wheels' console-script trampoline, as a shell stand-in
    trampoline.write_text(f"#!/bin/sh\nexec '{core / 'bin' / 'rocminfo'}' \"$@\"\n")
    trampoline.chmod(0o755)
    return root, site


@pytest.fixture(scope="module")
def outcomes(ds_tree: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """Every scenario's outcome on one tree, from one subprocess in a fresh fake venv."""
    if Path("/opt/rocm/bin/rocminfo").exists():
        pytest.skip("this machine has /opt/rocm/bin/rocminfo, which 0.19.5 runs before anything else")
    kind, tree = ds_tree
    venv, site = make_therock_venv(tmp_path_factory.mktemp("therock") / "venv")
    scenarios = [{"name": name, "rocm_home": home, "activated": activated, "env": env, "torch_version": torch,
                  "hip_version": HIP, "rocminfo": rocminfo}
                 for name, (home, activated, env, torch, rocminfo) in SCENARIOS.items()]
    spec = {"venv": str(venv), "site_packages": str(site), "scenarios": scenarios}
    result = run_python_in_tree(tree, PROBE, json.dumps(spec), python=venv / "bin" / "python")
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    assert results.pop("scripts_dir") == str(venv / "bin")  # a real venv: its bin/ is the scripts directory
    return kind, results


@pytest.mark.parametrize("scenario", ["rocm-home-core", "rocm-home-devel"])
def test_venv_not_activated_gets_arch_and_wave64_from_the_wheels_rocminfo(outcomes, scenario):
    kind, results = outcomes
    outcome = results[scenario]
    assert outcome["version"] == {"value": [10, 1]}  # .info/version or the "+rocm10.1" torch: both trees
    if kind == "pristine":  # the bug: rocminfo not on PATH, so no target and silently wave32 on a wave64 GPU
        assert outcome["arch"] == {"value": ""}
        assert outcome["wavefront"] == {"value": "32"}
    else:
        assert outcome["arch"] == {"value": "gfx90a"}
        assert outcome["wavefront"] == {"value": "64"}


def test_version_comes_from_rocm_sdk_not_from_hip(outcomes):
    kind, results = outcomes
    outcome = results["rocm-home-venv-untagged-torch"]
    # activated: rocminfo is on PATH, so every tree finds the GPU
    assert outcome["arch"] == {"value": "gfx90a"}
    assert outcome["wavefront"] == {"value": "64"}
    if kind == "pristine":  # no .info/version in the venv root, no "+rocm" in torch's version
        assert outcome["version"] == {"error": "AssertionError: Could not detect ROCm version"}
    else:  # rocm_sdk.__version__, not HIP's 7.16 (what patch 0017's torch.version.hip fallback gives)
        assert outcome["version"] == {"value": [10, 1]}


def test_no_gpu_visible_takes_the_wavefront_from_pytorch_rocm_arch(outcomes):
    kind, results = outcomes
    outcome = results["no-gpu-user-arch"]
    if kind == "pristine":  # the bug: the user's wave64 target is ignored, wave32 kernels
        assert outcome["arch"] == {"value": ""}
        assert outcome["wavefront"] == {"value": "32"}
    else:
        assert outcome["arch"] == {"value": "gfx942"}
        assert outcome["wavefront"] == {"value": "64"}


def test_no_gpu_and_no_arch_is_an_error_naming_the_fix(outcomes):
    kind, results = outcomes
    outcome = results["no-gpu-no-arch"]
    if kind == "pristine":  # the bug: silently wave32
        assert outcome["wavefront"] == {"value": "32"}
    else:
        error = outcome["wavefront"]["error"]
        assert error.startswith("RuntimeError: No ROCm target to build DeepSpeed ops for")
        assert "Set PYTORCH_ROCM_ARCH" in error
        # both copies of the wheels' rocminfo were tried: ROCM_HOME/bin's first, then the venv's trampoline
        assert "_rocm_sdk_core/bin/rocminfo, " in error and "/venv/bin/rocminfo)" in error

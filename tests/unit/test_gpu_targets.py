"""verify's `environment` check compares targets with targets: each GPU as what it is (its gfx target id with
features on ROCm, its compute capability on CUDA) against the receipt's targets, by the rules of each platform.

Issue 39: on an H100 (CUDA 13, torch 2.11) the check compared the GPU's *name* with the receipt's capabilities,
because a CUDA torch fills `gcnArchName` with the device name (torch/csrc/cuda/Module.cpp,
registerCudaDeviceProperties: "HIP-only property; reuse name attribute for CUDA builds"). No GPU here: torch is
a stand-in that answers with captured device properties (the ROCm ones from tests/fixtures/real).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.fakemachine import REAL

from mlstack_ds.worker import env_checks
from mlstack_ds.worker.gpu_targets import coverage, cuda_runs, device_targets, rocm_runs, split_gfx
from mlstack_ds.worker.protocol import CheckFailed

# What the H100 of issue 39 reported: name, and compute capability 9.0.
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, gcnArchName="NVIDIA H100 80GB HBM3")


def rocminfo_isa(fixture: str) -> str:
    """The first GPU ISA name of a real rocminfo capture, as torch's gcnArchName gives it (no triple)."""
    for line in (REAL / fixture).read_text().splitlines():
        name = line.split("Name:", 1)[-1].strip()
        if name.startswith("amdgcn-amd-amdhsa--"):
            return name.removeprefix("amdgcn-amd-amdhsa--")
    raise AssertionError(f"no ISA name in {fixture}")


MI210 = SimpleNamespace(name="AMD Instinct MI210", major=9, minor=0,
                        gcnArchName=rocminfo_isa("rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"))
HIP_VERSION = (REAL / "torch_version_hip_MI210-gfx90a_rocm-6.0_deepspeed-pr-5249.txt").read_text().strip()


def fake_torch(*props: SimpleNamespace, hip: str | None = None, cuda: str | None = "13.0") -> SimpleNamespace:
    return SimpleNamespace(
        __version__="2.11.0", version=SimpleNamespace(hip=hip, cuda=None if hip else cuda),
        cuda=SimpleNamespace(is_available=lambda: bool(props), device_count=lambda: len(props),
                             get_device_properties=lambda index: props[index]))


CUDA_H100 = fake_torch(H100)
ROCM_MI210 = fake_torch(MI210, MI210, hip=HIP_VERSION)


def test_the_captures_are_what_the_tests_say() -> None:
    assert MI210.gcnArchName == "gfx90a:sramecc+:xnack-" and HIP_VERSION == "6.0.32830-d62f6a171"


def test_a_cuda_gpu_is_its_compute_capability_not_its_name() -> None:
    assert env_checks.device_archs(CUDA_H100, SimpleNamespace(_name="cuda")) == ["9.0"]


def test_a_rocm_gpu_is_its_full_target_id() -> None:
    assert env_checks.device_archs(ROCM_MI210, SimpleNamespace(_name="cuda")) == ["gfx90a:sramecc+:xnack-"] * 2
    assert device_targets(fake_torch(SimpleNamespace(name="old", major=9, minor=0, gcnArchName=""),
                                     hip=HIP_VERSION)) == ["unknown"]


def test_no_gpu_and_the_cpu_accelerator_have_no_targets() -> None:
    assert env_checks.device_archs(fake_torch(), SimpleNamespace(_name="cuda")) == []
    assert env_checks.device_archs(CUDA_H100, SimpleNamespace(_name="cpu")) == []


@pytest.mark.parametrize(("built", "device", "runs"), [
    ("9.0", "9.0", "sm_90 code"),
    ("9.0a", "9.0", "sm_90a code"),              # the H100 of issue 39
    ("9.0a+PTX", "9.0", "sm_90a code"),
    ("8.0", "8.6", "sm_80 code"),                # SASS runs on later minors of its major
    ("8.6", "8.0", None),
    ("8.0", "9.0", None),                        # ... never across majors
    ("8.0+PTX", "9.0", "PTX of 8.0, JIT-compiled at first load (a slower start)"),
    ("9.0+PTX", "8.0", None),                    # PTX is not backward compatible
    ("9.0a", "10.0", None),                      # arch-specific: exactly that GPU
    ("9.0a+PTX", "10.0", None),                  # ... its PTX too
    ("10.0a", "10.3", None),
    ("10.0f", "10.3", "sm_100f code"),           # family-specific: the major's later minors
    ("10.0f", "12.0", None),
    ("Hopper", "9.0", None),
])
def test_cuda_coverage(built: str, device: str, runs: str | None) -> None:
    assert cuda_runs(built, device) == runs


@pytest.mark.parametrize(("built", "device", "runs"), [
    ("gfx90a", "gfx90a:sramecc+:xnack-", True),          # no features named: built for either setting
    ("gfx90a:xnack-", "gfx90a:sramecc+:xnack-", True),
    ("gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack-", True),
    ("gfx90a:xnack+", "gfx90a:sramecc+:xnack-", False),  # compiled for XNACK on, the GPU runs with it off
    ("gfx90a:sramecc-", "gfx90a:sramecc+:xnack-", False),
    ("gfx942", "gfx90a:sramecc+:xnack-", False),
    ("gfx1100", "gfx1100", True),
    ("gfx1100", "gfx1101", False),
])
def test_rocm_coverage(built: str, device: str, runs: bool) -> None:
    assert (rocm_runs(built, device) is not None) is runs


def test_target_ids_split_with_or_without_the_triple() -> None:
    assert split_gfx("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-") == ("gfx90a", {"sramecc": "+", "xnack": "-"})
    assert split_gfx("gfx1100") == ("gfx1100", {})


def test_coverage_prefers_sass_over_ptx() -> None:
    assert coverage(["8.0+PTX", "9.0"], ["9.0", "9.0"]) == {"9.0": "sm_90 code"}
    assert coverage(["8.0"], ["9.0"]) == {"9.0": None}


@pytest.fixture
def installed_deepspeed(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in for the installed DeepSpeed (not installed here): its version, build info and accelerator."""
    info = types.ModuleType("deepspeed.git_version_info")
    info.accelerator_name = "cuda"  # type: ignore[attr-defined]
    deepspeed = types.ModuleType("deepspeed")
    deepspeed.__version__ = "0.19.5"
    deepspeed.git_version_info = info  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", deepspeed)
    monkeypatch.setitem(sys.modules, "deepspeed.git_version_info", info)
    accelerator = SimpleNamespace(_name="cuda", communication_backend_name=lambda: "nccl", device_count=lambda: 1)
    monkeypatch.setattr(env_checks, "accelerator", lambda: accelerator)
    return deepspeed


def environment_check(torch: SimpleNamespace, deepspeed: types.ModuleType, platform: str,
                      archs: list[str]) -> dict:
    receipt = {"platform": platform, "deepspeed_version": "0.19.5", "archs": archs}
    ctx = SimpleNamespace(torch=torch, deepspeed=deepspeed, receipt=receipt, receipt_error=None,
                          receipt_path=Path("/venv/share/mlstack-ds/receipt.json"), import_error=None,
                          dist_ready=True, dist_error=None)
    return env_checks.check_environment(ctx)


@pytest.mark.parametrize("built", [["9.0"], ["9.0a"], ["8.0+PTX"]])
def test_the_h100_passes_when_the_receipt_has_code_for_it(installed_deepspeed, built: list[str]) -> None:
    details = environment_check(CUDA_H100, installed_deepspeed, "cuda", built)
    assert details["archs"] == ["9.0"] and details["built_archs"] == built
    assert ("JIT" in details["arch_coverage"]["9.0"]) is built[0].endswith("+PTX")


def test_the_h100_fails_naming_its_target_and_the_built_ones(installed_deepspeed) -> None:
    with pytest.raises(CheckFailed) as failed:
        environment_check(CUDA_H100, installed_deepspeed, "cuda", ["8.0", "8.6"])
    assert "GPU target 9.0 has no code in this install (built for 8.0, 8.6)" in str(failed.value)
    assert "H100" not in str(failed.value)


def test_the_mi210_is_compared_with_its_features(installed_deepspeed) -> None:
    details = environment_check(ROCM_MI210, installed_deepspeed, "rocm", ["gfx90a"])
    assert details["archs"] == ["gfx90a:sramecc+:xnack-"] * 2
    assert details["arch_coverage"] == {"gfx90a:sramecc+:xnack-": "gfx90a code"}
    with pytest.raises(CheckFailed, match=r"GPU target gfx90a:sramecc\+:xnack- has no code .*built for gfx90a:xnack\+"):
        environment_check(ROCM_MI210, installed_deepspeed, "rocm", ["gfx90a:xnack+"])

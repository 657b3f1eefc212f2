"""Rules for ROCm installed as TheRock's Python wheels: each fires on the state its sources describe, with the
fix PyTorch's own ROCm CI uses, and stays silent on the nearest healthy venv."""

from __future__ import annotations

import dataclasses

import pytest
from support.doctor_inputs import (
    HIP_714,
    VENV,
    VENV_SITE,
    make_input,
    rocm_torch,
    rocm_wheels,
    therock_env,
)

from mlstack_ds.detect.model import RocmInstall, TorchInfo
from mlstack_ds.doctor.engine import run_rules
from mlstack_ds.doctor.model import DoctorInput, Finding
from mlstack_ds.doctor.rules.wheel_rules import ROCM_HOME_FIX, torch_rocm_suffix

CPU_TORCH = TorchInfo("2.13.0+cpu", hip=None, cuda=None, arch_list=[], device_count=0, devices=[])
SYSTEM_62 = RocmInstall("/opt/rocm-6.2.2", "6.2.2", "/opt/rocm-6.2.2/.info/version", "6.2.2-116")


def findings(inp: DoctorInput) -> dict[str, Finding]:
    return {f.rule_id: f for f in run_rules(inp)}


def torch_for(rocm: str) -> TorchInfo:
    return rocm_torch(f"2.14.1+rocm{rocm}", HIP_714, ["gfx1100"])


def test_a_healthy_wheels_venv_has_no_findings() -> None:
    assert findings(make_input(therock_env())) == {}


def test_devel_missing_is_an_error_with_the_installed_version_in_the_fix() -> None:
    found = findings(make_input(therock_env(rocm_wheels(devel="absent"))))
    finding = found["MLS-ROCM-005"]
    assert finding.severity == "error"
    assert "torch 2.14.1+rocm7.14.0 loads it" in finding.evidence
    assert finding.fix == (
        f'{VENV}/bin/python -m pip install "rocm[devel]==7.14.0"'
        "   # from the index the installed rocm wheels came from",
        f"{VENV}/bin/rocm-sdk init",
        f"{ROCM_HOME_FIX}   # with the venv activated, or call {VENV}/bin/rocm-sdk",
    )
    assert "MLS-ROCM-006" not in found


def test_devel_missing_without_a_rocm_torch_is_a_warning() -> None:
    finding = findings(make_input(therock_env(rocm_wheels(devel="absent"), torch=CPU_TORCH)))["MLS-ROCM-005"]
    assert finding.severity == "warning"
    assert "no ROCm torch uses it yet" in finding.evidence


def test_devel_missing_with_an_unknown_version_asks_rocm_sdk() -> None:
    wheels = dataclasses.replace(rocm_wheels(devel="absent"), version=None)
    finding = findings(make_input(therock_env(wheels, torch=CPU_TORCH)))["MLS-ROCM-005"]
    assert f'"rocm[devel]==$({VENV}/bin/rocm-sdk version)"' in finding.fix[0]


def test_devel_not_expanded_is_a_warning_fixed_by_rocm_sdk_init() -> None:
    found = findings(make_input(therock_env(rocm_wheels(devel="tarball"))))
    finding = found["MLS-ROCM-006"]
    assert finding.severity == "warning"
    assert finding.fix[0] == f"{VENV}/bin/rocm-sdk init"
    assert "MLS-ROCM-005" not in found


@pytest.mark.parametrize(("name", "value", "what"), [
    ("ROCM_HOME", VENV, "the venv root"),
    ("ROCM_PATH", f"{VENV}/", "the venv root"),
    ("ROCM_HOME", f"{VENV_SITE}/_rocm_sdk_core", "_rocm_sdk_core"),
])
def test_rocm_home_at_the_venv_or_the_core_is_an_error(name: str, value: str, what: str) -> None:
    finding = findings(make_input(therock_env(env_vars={name: value})))["MLS-ROCM-007"]
    assert finding.severity == "error"
    assert f"{name}={value} is {what}" in finding.evidence
    assert f"{VENV_SITE}/_rocm_sdk_devel" in finding.evidence
    assert finding.fix == (f"{ROCM_HOME_FIX}   # with the venv activated, or call {VENV}/bin/rocm-sdk",)
    assert ROCM_HOME_FIX == "export ROCM_HOME=$(rocm-sdk path --root) ROCM_PATH=$ROCM_HOME"


def test_rocm_home_at_the_core_without_devel_installs_devel_first() -> None:
    env = therock_env(rocm_wheels(devel="absent"), env_vars={"ROCM_HOME": f"{VENV_SITE}/_rocm_sdk_core"})
    finding = findings(make_input(env))["MLS-ROCM-007"]
    assert '"rocm[devel]==7.14.0"' in finding.fix[0]
    assert finding.fix[1].startswith(ROCM_HOME_FIX)


def test_rocm_home_at_the_devel_tree_is_right() -> None:
    env = therock_env(env_vars={"ROCM_HOME": f"{VENV_SITE}/_rocm_sdk_devel",
                                "ROCM_PATH": f"{VENV_SITE}/_rocm_sdk_devel"})
    assert findings(make_input(env)) == {}


def test_a_system_rocm_of_another_version_is_a_warning() -> None:
    finding = findings(make_input(therock_env(system_rocm=SYSTEM_62)))["MLS-ROCM-008"]
    assert finding.severity == "warning"
    assert "system ROCm 6.2.2 (/opt/rocm-6.2.2)" in finding.evidence
    assert "wheels' ROCm 7.14.0" in finding.evidence
    assert finding.fix[0].startswith(ROCM_HOME_FIX)
    assert "/opt/rocm-6.2.2/bin after the venv's bin on PATH" in finding.fix[1]


def test_a_system_rocm_of_the_same_version_or_without_a_wheels_torch_is_silent() -> None:
    same = dataclasses.replace(SYSTEM_62, version="7.14.0")
    assert "MLS-ROCM-008" not in findings(make_input(therock_env(system_rocm=same)))
    assert "MLS-ROCM-008" not in findings(make_input(therock_env(torch=CPU_TORCH, system_rocm=SYSTEM_62)))


def test_torch_built_for_another_rocm_is_an_error_naming_torchs_version() -> None:
    env = therock_env(rocm_wheels("7.14.1"), torch=torch_for("7.14.0"))
    finding = findings(make_input(env))["MLS-ROCM-009"]
    assert finding.severity == "error"
    assert "built for ROCm 7.14.0; the installed rocm_sdk is 7.14.1" in finding.evidence
    assert finding.fix[0] == (f'{VENV}/bin/python -m pip install "rocm[libraries,devel]==7.14.0"'
                              "   # from the same index as torch")
    assert "torch built for ROCm 7.14.1" in finding.fix[1]


@pytest.mark.parametrize(("torch_rocm", "wheels"), [
    ("7.14", "7.14.0"),  # torch-2.14.1+rocm7.14: only major.minor is named
    ("10.1.0a20260811", "10.1.0a20260901"),  # nightlies of one release
    ("7.14.0", "7.14.0.dev0+abc123"),
])
def test_same_release_is_not_a_mismatch(torch_rocm: str, wheels: str) -> None:
    env = therock_env(rocm_wheels(wheels), torch=torch_for(torch_rocm))
    assert "MLS-ROCM-009" not in findings(make_input(env))


def test_torch_rocm_suffix() -> None:
    assert torch_rocm_suffix("2.13.0+rocm10.0.0") == "10.0.0"
    assert torch_rocm_suffix("2.12.0a0+rocm7.13.0a20260411") == "7.13.0a20260411"
    assert torch_rocm_suffix("2.5.1+rocm6.2") == "6.2"
    assert torch_rocm_suffix("2.6.0a0+git90b83a9") is None


def test_torchs_hip_is_not_compared_with_the_wheels_release() -> None:
    """ROCm 10.1 reports HIP 7.16: MLS-TORCH-004's HIP comparison would call a matching pair different."""
    env = therock_env(rocm_wheels("10.1.0"), torch=rocm_torch("2.13.0+rocm10.1.0", "7.16.0-stand-in", ["gfx1100"]))
    assert findings(make_input(env)) == {}


def test_a_system_rocm_named_by_rocm_path_is_said_to_be_used_by_builds() -> None:
    env = therock_env(system_rocm=SYSTEM_62, env_vars={"ROCM_PATH": "/opt/rocm-6.2.2"})
    finding = findings(make_input(env))["MLS-ROCM-008"]
    assert "(ROCM_PATH point(s) at it: builds would use it)" in finding.evidence

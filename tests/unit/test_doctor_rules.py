"""Every machine-state rule fires on a replayed machine that has its problem, and stays silent on a
near miss (and on a healthy machine). GPUs come from real rocminfo captures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from support.doctor_inputs import (
    APU780M,
    HIP_60,
    MI210X4,
    RX7900,
    SPOOFED680M,
    ds_build,
    gpus_from,
    healthy_facts,
    make_env,
    make_input,
    rocm_torch,
    rocm_wheels,
    therock_env,
)

from mlstack_ds.detect.model import DeepSpeedInfo, GpuAgent, PythonInfo, RocmInstall, TorchInfo
from mlstack_ds.doctor.bundle import BundleCoverage
from mlstack_ds.doctor.engine import run_rules
from mlstack_ds.doctor.jitlocks import JitLock, JitLockScan
from mlstack_ds.doctor.model import DoctorInput, Finding
from mlstack_ds.doctor.rules import RULES, rule_by_id
from mlstack_ds.doctor.shmsegments import ShmScan, ShmSegment

CUDA_TORCH = TorchInfo("2.7.0+cu128", hip=None, cuda="12.8", arch_list=["sm_90"], device_count=0, devices=[])
CPU_TORCH = TorchInfo("2.13.0+cpu", hip=None, cuda=None, arch_list=[], device_count=0, devices=[])
NO_AMD = healthy_facts(kfd_exists=False, kfd_accessible=False, kfd_native_archs=())
SITE = "/venv/lib/python3.11/site-packages"
WARMUP_PATCH = "0023-lr_schedules-accept-warmup_num_steps-0-again.patch"


def ds(version: str = "0.19.5") -> DeepSpeedInfo:
    return DeepSpeedInfo(version, SITE)


def rocm(version: str, source: str = "/opt/rocm/.info/version") -> RocmInstall:
    return RocmInstall("/opt/rocm", version, source, version)


def dgpu_and_igpu() -> list[GpuAgent]:
    """The RX 7900 XTX capture plus the 780M APU capture's GPU as a second, integrated agent
    (no single real capture with both was found; this is the layout ROCm/ROCm#2594 describes)."""
    igpu = gpus_from(APU780M)[0]
    return [*gpus_from(RX7900), dataclasses.replace(igpu, index=1)]


def two_radeons() -> list[GpuAgent]:
    gpu = gpus_from(RX7900)[0]
    return [gpu, dataclasses.replace(gpu, index=1)]


def spoofed_mi210() -> DoctorInput:
    """ROCm/legacy-rocm-build#5238: a forgotten HSA_OVERRIDE_GFX_VERSION=10.3.0 on MI210s
    (KFD still says gfx90a)."""
    env = make_env(gpus_from(MI210X4, "10.3.0"), env_vars={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"},
                   rocm=rocm("6.2.4"))
    return make_input(env, healthy_facts(kfd_native_archs=("gfx90a",) * 4))


def spoofed_680m() -> DoctorInput:
    """ROCm/ROCm#5225: a 680M (natively gfx1035) run as gfx1030."""
    env = make_env(gpus_from(SPOOFED680M, "10.3.0"), env_vars={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"},
                   rocm=rocm("5.7.0"))
    return make_input(env, healthy_facts(kfd_native_archs=("gfx1035",)))


def gpu_less_build_host(**env_vars: str) -> DoctorInput:
    return make_input(make_env(gpus=[], env_vars=env_vars), NO_AMD)


EXT = "/home/u/.cache/torch_extensions/py311_rocm62"


def jit_locks(*owners: tuple[int, ...], unreadable: int = 0) -> DoctorInput:
    """One cpu_adam lock per entry of `owners` (pids building it; () for a killed build)."""
    locks = tuple(JitLock(f"{EXT}/op{n}/lock", f"op{n}", 3 * 3600.0, pids) for n, pids in enumerate(owners))
    return make_input(facts=healthy_facts(jit_locks=JitLockScan(EXT, locks, unreadable)))


SYSTEM_ROCM = RocmInstall("/opt/rocm-6.2.2", "6.2.2", "/opt/rocm-6.2.2/.info/version", "6.2.2-116")


SHM = "/dev/shm/deepspeed_allreduce_buffer_0_127.0.0.1_29517_"  # the names the captured run left
SEGMENT_BYTES = 69206024  # their size (tests/fixtures/doctor-shm)


def shm_segments(*users: tuple[int, ...], unknown: bool = False, unreadable: int = 0) -> DoctorInput:
    """One segment per entry of `users` (pids mapping it; () when its ranks are gone)."""
    segments = tuple(ShmSegment(f"{SHM}{rank}", SEGMENT_BYTES, 0, pids, unknown=unknown)
                     for rank, pids in enumerate(users))
    return make_input(facts=healthy_facts(shm_segments=ShmScan("/dev/shm", segments, unreadable)))


def cpu_box(**tools: str) -> DoctorInput:
    return make_input(make_env(gpus=[], torch=CPU_TORCH), dataclasses.replace(NO_AMD, tools=tools))


def mi210s_with(**env_vars: str) -> DoctorInput:
    return make_input(make_env(gpus_from(MI210X4), env_vars=env_vars, rocm=rocm("6.2.4")))


# rule id -> a machine that has the problem
TRIGGERS: dict[str, Callable[[], DoctorInput]] = {
    "MLS-TORCH-001": lambda: make_input(make_env(torch=None)),
    "MLS-TORCH-002": lambda: make_input(make_env(torch=CUDA_TORCH),
                                        healthy_facts(nvidia_packages=("nvidia-cublas-cu12",))),
    "MLS-TORCH-003": lambda: make_input(make_env(torch=CPU_TORCH)),
    "MLS-TORCH-004": lambda: make_input(make_env(torch=rocm_torch("2.3.1+rocm6.0", HIP_60))),
    "MLS-DEV-001": gpu_less_build_host,
    "MLS-DEV-002": lambda: make_input(make_env(gpus=[]), healthy_facts(kfd_accessible=False)),
    "MLS-GPU-001": lambda: make_input(make_env(gpus=[])),
    "MLS-GPU-002": lambda: make_input(make_env(dgpu_and_igpu())),
    "MLS-ARCH-001": lambda: make_input(make_env(gpus_from(APU780M), rocm=rocm("6.1.1"))),
    "MLS-ARCH-002": lambda: make_input(make_env(env_vars={"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"})),
    "MLS-ENV-001": lambda: make_input(make_env(gpus_from(RX7900, "11.0.0"),
                                              env_vars={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})),
    "MLS-ENV-002": spoofed_mi210,
    "MLS-ENV-003": lambda: make_input(make_env(env_vars={"DS_ACCELERATOR": "cpu"})),
    "MLS-ENV-004": spoofed_680m,
    "MLS-ENV-005": lambda: make_input(make_env(env_vars={"DS_ACCELERATOR": "rocm"})),
    "MLS-ENV-006": lambda: make_input(make_env(env_vars={"DS_BUILD_OPS": "1"})),
    "MLS-ARCH-003": lambda: make_input(make_env(env_vars={"PYTORCH_ROCM_ARCH": "gfx1100;gfx90a"})),
    "MLS-ROCM-004": lambda: make_input(facts=healthy_facts(rocm_env_missing=("ROCM_PATH=/opt/rocm-9.9",))),
    "MLS-GPU-003": lambda: mi210s_with(HIP_VISIBLE_DEVICES="4"),
    "MLS-BUILD-006": lambda: jit_locks(()),
    "MLS-ROCM-001": lambda: make_input(make_env(rocm=rocm("5.4.3"))),
    "MLS-ROCM-002": lambda: make_input(make_env(gpus_from(MI210X4), rocm=rocm("5.6.1"))),
    "MLS-ROCM-003": lambda: make_input(make_env(torch=rocm_torch("2.6.0a0+git90b83a9")),
                                       healthy_facts(rocm_info_version_file=False)),
    "MLS-BUILD-001": lambda: make_input(facts=healthy_facts(tools={"c++": "/usr/bin/c++", "ninja": "/n"})),
    "MLS-BUILD-002": lambda: make_input(facts=healthy_facts(tools={"c++": "/usr/bin/c++", "hipcc": "/h"})),
    "MLS-BUILD-003": lambda: make_input(facts=healthy_facts(python_headers=False)),
    "MLS-BUILD-004": lambda: make_input(facts=healthy_facts(tools={"ninja": "/n", "hipcc": "/h"})),
    "MLS-BUILD-005": lambda: make_input(facts=healthy_facts(libaio_headers=False)),
    "MLS-BUILD-007": lambda: make_input(dataclasses.replace(
        make_env(), python=PythonInfo("/venv/bin/python", "3.11.7", setuptools="65.5.0", wheel_package=False))),
    "MLS-BUILD-008": lambda: dataclasses.replace(make_input(), bundle=BundleCoverage(
        Path("/srv/bundle"), "3.11", "the bundle in /srv/bundle lacks what this install needs: hjson (runtime: ...)",
        "complete it: mlstack-ds bundle --to /srv/bundle ...")),
    "MLS-DS-001": lambda: make_input(
        make_env(torch=rocm_torch("2.3.1+rocm6.0", HIP_60), deepspeed=ds("0.14.0"), rocm=rocm("6.0.2")),
        healthy_facts(ds_build=ds_build({"async_io": False, "cpu_adam": False}, "0.0", "0.0"))),
    "MLS-DS-002": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build(hip="6.0"))),
    "MLS-DS-003": lambda: make_input(make_env(deepspeed=ds()),
                                     healthy_facts(ds_build=ds_build(), receipt_exists=False)),
    "MLS-DS-004": lambda: make_input(make_env(deepspeed=ds("0.17.5")), healthy_facts(ds_build=ds_build())),
    "MLS-DS-005": lambda: make_input(make_env(deepspeed=ds("0.14.0")), healthy_facts(ds_build=ds_build())),
    "MLS-DS-006": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(
        ds_build=ds_build(), install_damage=("installed files changed: 1 missing (deepspeed/ops/adam/"
                                             "cpu_adam_op.so) of the 1500 files listed in /r/RECORD",))),
    "MLS-DS-101": lambda: make_input(make_env(deepspeed=ds("0.19.5")), healthy_facts(
        ds_build=ds_build(), clients=(("accelerate", "1.15.0"), ("transformers", "5.17.0")))),
    "MLS-SYS-001": lambda: make_input(facts=healthy_facts(shm_bytes=64 * 1024**2)),
    "MLS-SYS-002": lambda: make_input(facts=healthy_facts(memlock_soft_bytes=8 * 1024**2)),
    "MLS-SYS-003": lambda: shm_segments((), ()),
    "MLS-SYS-004": lambda: cpu_box(**{"c++": "/usr/bin/c++"}),
    "MLS-NET-001": lambda: make_input(make_env(gpus_from(MI210X4), rocm=rocm("6.2.4")),
                                      healthy_facts(kernel_cmdline="ro quiet")),
    "MLS-ROCM-005": lambda: make_input(therock_env(rocm_wheels(devel="absent"))),
    "MLS-ROCM-006": lambda: make_input(therock_env(rocm_wheels(devel="tarball"))),
    "MLS-ROCM-007": lambda: make_input(therock_env(env_vars={"ROCM_HOME": "/home/u/venv"})),
    "MLS-ROCM-008": lambda: make_input(therock_env(system_rocm=SYSTEM_ROCM)),
    "MLS-ROCM-009": lambda: make_input(therock_env(rocm_wheels("7.14.1"),
                                                   torch=rocm_torch("2.14.1+rocm7.14.0", arch_list=["gfx1100"]))),
}

# rule id -> the closest machine that does NOT have the problem
SILENT: dict[str, Callable[[], DoctorInput]] = {
    "MLS-TORCH-001": make_input,
    "MLS-TORCH-002": lambda: make_input(make_env(gpus=[], torch=CUDA_TORCH), NO_AMD),  # a CUDA box
    "MLS-TORCH-003": lambda: make_input(make_env(gpus=[], torch=CPU_TORCH), NO_AMD),  # a CPU box
    "MLS-TORCH-004": lambda: make_input(make_env(torch=rocm_torch("2.3.1+rocm6.0", HIP_60),
                                                 rocm=rocm("6.0", "torch.version.hip"))),
    "MLS-DEV-001": lambda: gpu_less_build_host(DS_ACCELERATOR="cuda", PYTORCH_ROCM_ARCH="gfx90a"),
    "MLS-DEV-002": make_input,
    "MLS-GPU-001": gpu_less_build_host,  # /dev/kfd missing: MLS-DEV-001 explains it
    "MLS-GPU-002": lambda: make_input(make_env(dgpu_and_igpu(), env_vars={"HIP_VISIBLE_DEVICES": "0"})),
    "MLS-ARCH-001": make_input,
    "MLS-ARCH-002": lambda: make_input(make_env(env_vars={"PYTORCH_ROCM_ARCH": "gfx1100;gfx90a"})),
    "MLS-ENV-001": spoofed_680m,  # the override is needed there: gfx1035 is not supported natively
    "MLS-ENV-002": spoofed_680m,  # same family, same wave size
    "MLS-ENV-003": lambda: make_input(make_env(env_vars={"DS_ACCELERATOR": "cuda"})),
    "MLS-ENV-004": spoofed_mi210,  # MLS-ENV-002 speaks instead
    "MLS-ENV-005": lambda: make_input(make_env(env_vars={"DS_ACCELERATOR": "cpu"})),  # accepted (ENV-003's)
    "MLS-ENV-006": lambda: make_input(make_env(env_vars={"DS_BUILD_OPS": "0"})),  # what mlstack-ds sets
    "MLS-ARCH-003": lambda: mi210s_with(PYTORCH_ROCM_ARCH="gfx90a;gfx942:sramecc+:xnack-"),  # both wave64
    "MLS-ROCM-004": make_input,
    "MLS-GPU-003": lambda: mi210s_with(HIP_VISIBLE_DEVICES="3,1"),
    "MLS-BUILD-006": lambda: jit_locks((4242,)),  # a build in progress
    "MLS-ROCM-001": lambda: make_input(make_env(rocm=rocm("5.5.0"))),
    "MLS-ROCM-002": lambda: make_input(make_env(gpus_from(MI210X4), rocm=rocm("5.7.1"))),
    "MLS-ROCM-003": lambda: make_input(facts=healthy_facts(rocm_info_version_file=False)),  # +rocm6.2 suffix
    "MLS-BUILD-001": lambda: make_input(make_env(gpus=[], torch=CPU_TORCH),
                                        dataclasses.replace(NO_AMD, tools={"c++": "/c++", "ninja": "/n"})),
    "MLS-BUILD-002": make_input,
    "MLS-BUILD-003": make_input,
    "MLS-BUILD-004": lambda: make_input(facts=healthy_facts(tools={"clang++": "/usr/bin/clang++",
                                                                   "ninja": "/n", "hipcc": "/h"})),
    "MLS-BUILD-005": make_input,
    "MLS-BUILD-007": lambda: make_input(dataclasses.replace(
        make_env(), python=PythonInfo("/venv/bin/python", "3.11.7", setuptools="65.5.0", wheel_package=True))),
    "MLS-BUILD-008": lambda: dataclasses.replace(make_input(), bundle=BundleCoverage(Path("/srv/bundle"), "3.11")),
    "MLS-DS-001": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build())),
    "MLS-DS-002": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build())),
    "MLS-DS-003": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build())),
    "MLS-DS-004": lambda: make_input(make_env(deepspeed=ds("0.17.6")), healthy_facts(ds_build=ds_build())),
    "MLS-DS-005": lambda: make_input(make_env(gpus_from(MI210X4), deepspeed=ds("0.14.0")),
                                     healthy_facts(ds_build=ds_build())),  # wave64
    "MLS-DS-006": lambda: make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build())),
    "MLS-DS-101": lambda: make_input(make_env(deepspeed=ds("0.19.5")), healthy_facts(  # built with our patch
        ds_build=ds_build(), clients=(("transformers", "5.17.0"),), receipt_patches=(WARMUP_PATCH,))),
    "MLS-SYS-001": make_input,
    "MLS-SYS-002": lambda: make_input(facts=healthy_facts(memlock_soft_bytes=8 * 1024**3)),
    "MLS-SYS-003": lambda: shm_segments((4242,), (4243,)),  # a job running
    "MLS-SYS-004": lambda: cpu_box(numactl="/usr/bin/numactl"),
    "MLS-NET-001": lambda: make_input(make_env(gpus_from(MI210X4), rocm=rocm("6.2.4"))),  # iommu=pt
    "MLS-ROCM-005": lambda: make_input(therock_env()),  # rocm[devel] installed and expanded
    "MLS-ROCM-006": lambda: make_input(therock_env(rocm_wheels(devel="absent"))),  # MLS-ROCM-005 speaks
    "MLS-ROCM-007": lambda: make_input(therock_env(env_vars={
        "ROCM_HOME": "/home/u/venv/lib/python3.12/site-packages/_rocm_sdk_devel"})),
    "MLS-ROCM-008": lambda: make_input(make_env()),  # a system ROCm alone
    "MLS-ROCM-009": lambda: make_input(therock_env(rocm_wheels("7.14.0"),
                                                   torch=rocm_torch("2.14.1+rocm7.14", arch_list=["gfx1100"]))),
}


def findings_of(inp: DoctorInput) -> dict[str, Finding]:
    return {f.rule_id: f for f in run_rules(inp)}


def test_every_machine_state_rule_has_a_trigger_and_a_silent_case() -> None:
    checked = {rule.id for rule in RULES if rule.check is not None}
    assert set(TRIGGERS) == checked
    assert set(SILENT) == checked


def test_a_healthy_rocm_workstation_has_no_findings() -> None:
    assert run_rules(make_input()) == []
    with_ds = make_input(make_env(deepspeed=ds()), healthy_facts(ds_build=ds_build()))
    assert run_rules(with_ds) == []


@pytest.mark.parametrize("rule_id", sorted(TRIGGERS))
def test_rule_fires(rule_id: str) -> None:
    found = findings_of(TRIGGERS[rule_id]())
    assert rule_id in found, f"{rule_id} did not fire; got {sorted(found)}"
    finding = found[rule_id]
    rule = rule_by_id(rule_id)
    assert finding.title == rule.title
    assert finding.evidence
    assert finding.fix
    assert finding.docs == f"docs/troubleshooting.md#{rule_id.lower()}"


@pytest.mark.parametrize("rule_id", sorted(SILENT))
def test_rule_stays_silent(rule_id: str) -> None:
    assert rule_id not in findings_of(SILENT[rule_id]())


def test_cuda_torch_finding_names_the_nvidia_wheels_and_removes_them() -> None:
    finding = findings_of(TRIGGERS["MLS-TORCH-002"]())["MLS-TORCH-002"]
    assert "nvidia-cublas-cu12" in finding.evidence
    assert "pip uninstall -y nvidia-cublas-cu12" in finding.fix
    assert any("download.pytorch.org/whl/rocm6.2" in step for step in finding.fix)


def test_damaged_install_finding_names_the_files_and_reinstalls() -> None:
    finding = findings_of(TRIGGERS["MLS-DS-006"]())["MLS-DS-006"]
    assert finding.severity == "error" and "deepspeed/ops/adam/cpu_adam_op.so" in finding.evidence
    assert finding.fix[0].startswith("mlstack-ds install --force")


def test_igpu_fix_keeps_the_discrete_gpu_visible() -> None:
    finding = findings_of(TRIGGERS["MLS-GPU-002"]())["MLS-GPU-002"]
    assert "gfx1103" in finding.evidence
    assert "export HIP_VISIBLE_DEVICES=0" in finding.fix


def test_arch_rules_name_the_missing_target() -> None:
    assert "gfx1103" in findings_of(TRIGGERS["MLS-ARCH-001"]())["MLS-ARCH-001"].evidence
    arch = findings_of(TRIGGERS["MLS-ARCH-002"]())["MLS-ARCH-002"]
    assert "gfx1100" in arch.evidence
    assert 'export PYTORCH_ROCM_ARCH="gfx1100;gfx90a;gfx942"' in arch.fix


def test_override_on_mi210_is_an_error_naming_both_families() -> None:
    finding = findings_of(spoofed_mi210())["MLS-ENV-002"]
    assert finding.severity == "error"
    assert "gfx1030 (RDNA2, wave32)" in finding.evidence
    assert "gfx90a (CDNA2, wave64)" in finding.evidence


def test_unparseable_override_is_reported() -> None:
    inp = make_input(make_env(env_vars={"HSA_OVERRIDE_GFX_VERSION": "gfx1030"}))
    assert "not a <major>.<minor>.<stepping>" in findings_of(inp)["MLS-ENV-002"].evidence


def test_ds_accelerator_rocm_raises_value_error_but_cpu_only_misroutes() -> None:
    rejected = findings_of(TRIGGERS["MLS-ENV-005"]())
    assert "MLS-ENV-003" not in rejected  # one finding per mistake
    assert rejected["MLS-ENV-005"].evidence.endswith(
        "`ValueError: DS_ACCELERATOR must be one of ['cuda', 'cpu', 'xpu', 'npu', 'mps', 'hpu', 'mlu', 'sdaa', "
        "'supa']. Value \"rocm\" is not supported`")
    cpu = findings_of(make_input(make_env(env_vars={"DS_ACCELERATOR": "cpu"})))["MLS-ENV-003"]
    assert "cpu accelerator" in cpu.evidence


def test_rocm_too_old_names_the_needed_release() -> None:
    finding = findings_of(TRIGGERS["MLS-ROCM-001"]())["MLS-ROCM-001"]
    assert "gfx1100 needs ROCm >= 5.5" in finding.evidence
    assert finding.fix == ("install ROCm >= 5.5 and a torch built for it",)


def test_recipe_minimum_is_a_parameter() -> None:
    assert "MLS-ROCM-002" not in findings_of(make_input())
    assert "needs >= 6.3" in findings_of(make_input(min_rocm="6.3"))["MLS-ROCM-002"].evidence


def test_libaio_is_info_unless_nvme_offload_is_configured() -> None:
    inp = TRIGGERS["MLS-BUILD-005"]()
    assert findings_of(inp)["MLS-BUILD-005"].severity == "info"
    nvme = dataclasses.replace(inp, nvme_offload=True)
    assert findings_of(nvme)["MLS-BUILD-005"].severity == "error"


def test_ds_version_mismatch_names_both_hip_versions() -> None:
    finding = findings_of(TRIGGERS["MLS-DS-002"]())["MLS-DS-002"]
    assert "ops built with HIP 6.0, torch's HIP is 6.2" in finding.evidence


def test_p2p_hint_only_for_radeon() -> None:
    mi210 = findings_of(TRIGGERS["MLS-NET-001"]())["MLS-NET-001"]
    assert not any("NCCL_P2P_DISABLE" in step for step in mi210.fix)
    radeons = make_input(make_env(two_radeons()), healthy_facts(kernel_cmdline="ro quiet"))
    assert any("NCCL_P2P_DISABLE=1" in step for step in findings_of(radeons)["MLS-NET-001"].fix)
    iommu_off = make_input(make_env(two_radeons()), healthy_facts(kernel_cmdline="ro", iommu_enabled=False))
    assert "MLS-NET-001" not in findings_of(iommu_off)


def test_findings_are_sorted_errors_first() -> None:
    inp = make_input(make_env(torch=CPU_TORCH), healthy_facts(libaio_headers=False, shm_bytes=1024))
    severities = [f.severity for f in run_rules(inp)]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error" and severities[-1] == "info"


def test_gfx1201_before_rocm_6_4_is_too_old() -> None:
    """The issue's example: RDNA4 (RX 9070, gfx1201) needs ROCm 6.4."""
    gpu = dataclasses.replace(gpus_from(RX7900)[0], arch="gfx1201", target_id="gfx1201", family="RDNA4")
    assert "gfx1201 needs ROCm >= 6.4" in findings_of(make_input(make_env([gpu])))["MLS-ROCM-001"].evidence
    assert "MLS-ROCM-001" not in findings_of(make_input(make_env([gpu], rocm=rocm("6.4.1"))))


def test_unknown_python_include_dir_is_not_reported_as_missing_headers() -> None:
    facts = healthy_facts(python_headers=False, python_include=None)
    assert "MLS-BUILD-003" not in findings_of(make_input(facts=facts))


@pytest.mark.parametrize("value", ["", "CUDA", "cuda ", "hip"])
def test_ds_accelerator_is_compared_raw_like_deepspeed_does(value: str) -> None:
    """real_accelerator.py: `"DS_ACCELERATOR" in os.environ`, then an exact list lookup; even a CPU box."""
    inp = make_input(make_env(gpus=[], torch=CPU_TORCH, env_vars={"DS_ACCELERATOR": value}), NO_AMD)
    assert f"DS_ACCELERATOR={value!r}" in findings_of(inp)["MLS-ENV-005"].evidence


def test_ds_build_ops_is_a_warning_from_the_environment_and_an_error_from_a_log() -> None:
    assert findings_of(TRIGGERS["MLS-ENV-006"]())["MLS-ENV-006"].severity == "warning"
    assert rule_by_id("MLS-ENV-006").severity == "error"
    cpu_box = make_input(make_env(gpus=[], torch=CPU_TORCH, env_vars={"DS_BUILD_OPS": "1"}), NO_AMD)
    assert "MLS-ENV-006" not in findings_of(cpu_box)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gfx1100;gfx90a", "targets mix wave32 and wave64 GPUs: wave32: gfx1100; wave64: gfx90a"),
        ("gfx90a;sm_80", "PYTORCH_ROCM_ARCH='gfx90a;sm_80': 'sm_80' is not a known GPU target"),
        ("gfx9999", "PYTORCH_ROCM_ARCH='gfx9999': 'gfx9999' is not a known GPU target"),
        (";", "PYTORCH_ROCM_ARCH=';': no GPU target given"),
    ],
)
def test_rocm_arch_refused_with_the_plans_own_words(value: str, message: str) -> None:
    from mlstack_ds.errors import UsageError
    from mlstack_ds.plan.targets import select_rocm_targets

    finding = findings_of(mi210s_with(PYTORCH_ROCM_ARCH=value))["MLS-ARCH-003"]
    assert finding.evidence == message
    with pytest.raises(UsageError) as refused:  # the plan says the same
        select_rocm_targets(mi210s_with(PYTORCH_ROCM_ARCH=value).env, None)
    assert refused.value.message == message
    assert finding.fix[0] == refused.value.hint


@pytest.mark.parametrize(
    ("value", "hides_all"),
    [
        ("4", True), ("-1", True), ("0,0", True), ("GPU-ffffffffffffffff", True), ("", True),
        ("0", False), ("3,1", False), ("1,-1,0", False), ("GPU-3644c2b4f8c805bb", False),
        ("GPU-29273e62", False),  # a unique prefix, as CUDA allows
    ],
)
def test_hip_visible_devices_read_like_torch(value: str, hides_all: bool) -> None:
    found = findings_of(mi210s_with(HIP_VISIBLE_DEVICES=value))
    assert ("MLS-GPU-003" in found) is hides_all
    if hides_all:
        assert "0 (gfx90a, GPU-29273e62ca00396c)" in found["MLS-GPU-003"].evidence


def test_stale_jit_lock_fix_removes_exactly_the_ownerless_locks() -> None:
    finding = findings_of(jit_locks((), (77,), ()))["MLS-BUILD-006"]
    assert finding.fix[0] == f"rm -f {EXT}/op0/lock {EXT}/op2/lock"
    assert "op1" not in finding.evidence
    assert "(op op0, 3 h old)" in finding.evidence
    noted = findings_of(jit_locks((), unreadable=5))["MLS-BUILD-006"]
    assert "5 process(es) of other users not inspected" in noted.evidence


def test_leaked_shm_fix_removes_exactly_the_unused_segments() -> None:
    finding = findings_of(shm_segments((), (77,), (), ()))["MLS-SYS-003"]
    assert finding.fix[0] == f"rm -f {SHM}0 {SHM}2 {SHM}3"
    names = [f"{SHM}{rank}".rsplit("/", 1)[1] for rank in (0, 2, 3)]  # rank 1 is in use
    assert finding.evidence.endswith(": " + ", ".join(names))
    assert "3 DeepSpeed all-reduce segment(s) in /dev/shm, 198 MiB" in finding.evidence
    assert "1 more in use or not inspectable, left alone" in finding.evidence
    assert finding.severity == "warning"


def test_a_segment_whose_owner_could_not_be_inspected_is_never_reported() -> None:
    """Without the kernel's answer (busy=None), a process of the owner that could not be read may use it."""
    assert "MLS-SYS-003" not in findings_of(shm_segments((), unknown=True))
    noted = findings_of(shm_segments((), unreadable=3))["MLS-SYS-003"]
    assert "judged from /proc alone; 3 process(es) could not be inspected" in noted.evidence


def test_numactl_is_info_on_a_cpu_box_and_an_error_from_a_log() -> None:
    assert findings_of(TRIGGERS["MLS-SYS-004"]())["MLS-SYS-004"].severity == "info"
    assert rule_by_id("MLS-SYS-004").severity == "error"
    assert "MLS-SYS-004" not in findings_of(make_input())  # ROCm: only --bind_cores_to_rank needs it

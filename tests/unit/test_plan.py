"""The build plan, table-driven over replayed machines (real captures -> detect -> plan)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.fakemachine import REAL, FakeMachine

from mlstack_ds.detect import detect
from mlstack_ds.detect.environment import decide_platform
from mlstack_ds.detect.model import Environment, TorchInfo
from mlstack_ds.detect.toolchain import Toolchain
from mlstack_ds.errors import EnvironmentProblem, UsageError
from mlstack_ds.plan.buildplan import PatchRef, PlanOptions, cache_key, key_material, make_plan, plan_differences
from mlstack_ds.plan.targets import parse_arch_option
from mlstack_ds.recipe import find_recipe

# torch 2.7.1+rocm6.2.4's arch list as it prints it (research: astral-sh/uv#14086 runtime output).
WHEEL_ARCHS_2_7 = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
                   "gfx1200", "gfx1201"]
ROCM_TORCH = TorchInfo("2.7.1+rocm6.2.4", "6.2.41134-65d174c3e", None, WHEEL_ARCHS_2_7, 1, [])
CUDA_TORCH = TorchInfo("2.7.0+cu128", None, "12.8", ["sm_90"], 1, [])
CPU_TORCH = TorchInfo("2.13.0+cpu", None, None, [], 0, [])
FULL_TOOLCHAIN = Toolchain(cxx="/usr/bin/c++", hipcc="/opt/rocm/bin/hipcc", nvcc="/usr/local/cuda/bin/nvcc",
                           ninja="/usr/bin/ninja", ccache_dir=None, libaio_headers=True, python_headers=True)
PATCHES = [PatchRef("0001-x.patch", "a" * 64)]


def machine(fake: FakeMachine, bare_python: Path, rocminfo: str | None, torch: TorchInfo | None,
            rocm_version: str | None = "6.2.4", **env: str) -> Environment:
    if rocminfo:
        fake.tool("rocminfo", text=rocminfo if "\n" in rocminfo else (REAL / rocminfo).read_text())
    if rocm_version:
        fake.rocm_root({".info/version": f"{rocm_version}-1\n"})
    fake.extra_env.update(env)
    environment = detect(environ=fake.environ(), python=bare_python)
    # A ROCm or CUDA torch cannot exist on this machine: its facts are faked here, and the platform
    # decided again from them exactly as detect does.
    amd = [g for g in environment.gpus if g.vendor == "amd"]
    nvidia = [g for g in environment.gpus if g.vendor == "nvidia"]
    platform = decide_platform(amd, nvidia, torch, rocm_found=environment.rocm is not None)
    # The bare venv has no setuptools; an interpreter with a torch has the one torch requires (84 here).
    python = dataclasses.replace(environment.python, setuptools="84.2.1", wheel_package=False)
    return dataclasses.replace(environment, torch=torch, platform=platform, python=python)


def plan_for(environment: Environment, archs: str | None = None, toolchain: Toolchain = FULL_TOOLCHAIN):
    options = PlanOptions(archs=parse_arch_option(archs) if archs else None, jobs=4)
    return make_plan(environment, find_recipe("deepspeed-0.19.5"), toolchain, PATCHES, options)


def test_rx_7900_xtx(fake_machine, bare_python) -> None:
    plan = plan_for(machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH))
    assert (plan.platform, plan.archs, plan.wavefront) == ("rocm", ("gfx1100",), 32)
    assert plan.targets_source == "detected"
    assert plan.env["DS_ACCELERATOR"] == "cuda"  # never "rocm": DeepSpeed raises ValueError on it
    assert plan.env["PYTORCH_ROCM_ARCH"] == "gfx1100" and plan.env["DS_BUILD_OPS"] == "0"
    assert plan.env["DS_BUILD_FUSED_ADAM"] == "1" and plan.env["DS_BUILD_SPARSE_ATTN"] == "0"
    assert plan.env["MAX_JOBS"] == "4" and plan.env["ROCM_HOME"].endswith("rocm")
    assert {"fused_adam", "fused_lamb", "cpu_adam", "async_io"} <= set(plan.built_ops)
    assert not {"sparse_attn", "evoformer_attn", "gds", "fp_quantizer"} & set(plan.built_ops)


def test_four_mi210_build_one_target(fake_machine, bare_python) -> None:
    plan = plan_for(machine(fake_machine, bare_python, "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt", ROCM_TORCH))
    assert (plan.archs, plan.wavefront, plan.env["PYTORCH_ROCM_ARCH"]) == (("gfx90a",), 64, "gfx90a")


def test_dgpu_plus_igpu_excludes_the_igpu(fake_machine, bare_python) -> None:
    dgpu = (REAL / "rocminfo_gfx1100_rocm-issue-3949.txt").read_text()
    apu = (REAL / "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt").read_text()
    both = dgpu + "*******\nAgent 3" + apu.split("Agent 2", 1)[1]
    plan = plan_for(machine(fake_machine, bare_python, both, ROCM_TORCH))
    assert plan.archs == ("gfx1100",)
    assert any("gfx1103 left out" in note for note in plan.notes)


def test_apu_only_builds_for_the_apu(fake_machine, bare_python) -> None:
    with_apu = dataclasses.replace(ROCM_TORCH, arch_list=[*WHEEL_ARCHS_2_7, "gfx1103"])
    plan = plan_for(machine(fake_machine, bare_python, "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt", with_apu))
    assert plan.archs == ("gfx1103",)


def test_apu_torch_has_no_code_for_is_refused_naming_torchs_list(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt", ROCM_TORCH)
    with pytest.raises(EnvironmentProblem, match="target gfx1103 is not in torch 2.7.1.rocm6.2.4's arch list "
                       r"\(gfx900;gfx906;.*gfx1201\)") as info:
        plan_for(environment)
    assert "MLS-ARCH-001" in info.value.hint


def test_targets_unchecked_when_torch_lists_no_arch(fake_machine, bare_python) -> None:
    """torch.cuda.get_arch_list() is [] without a device on older torch; the probe reads the build's arch
    flags instead, and when even those are missing the plan says it could not check."""
    blind = dataclasses.replace(ROCM_TORCH, arch_list=[], device_count=0)
    plan = plan_for(machine(fake_machine, bare_python, None, blind), archs="gfx1151")
    assert plan.archs == ("gfx1151",)
    assert any("could not check the targets" in note for note in plan.notes)


def test_pytorch_rocm_arch_builds_without_a_gpu(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, None, ROCM_TORCH, PYTORCH_ROCM_ARCH="gfx90a;gfx942")
    plan = plan_for(environment)
    assert (plan.archs, plan.wavefront, plan.targets_source) == (("gfx90a", "gfx942"), 64, "environment")
    assert plan.env["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942"


def test_arch_flag_beats_pytorch_rocm_arch_and_says_so(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, None, ROCM_TORCH, PYTORCH_ROCM_ARCH="gfx90a")
    plan = plan_for(environment, archs="gfx942")
    assert (plan.archs, plan.targets_source) == (("gfx942",), "flag")
    assert any("PYTORCH_ROCM_ARCH=gfx90a ignored" in note for note in plan.notes)


def test_pytorch_rocm_arch_beats_the_detected_gpu_and_says_so(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH,
                          PYTORCH_ROCM_ARCH="gfx1100 gfx1101")
    plan = plan_for(environment)
    assert (plan.archs, plan.targets_source) == (("gfx1100", "gfx1101"), "environment")
    assert any("not the detected gfx1100" in note for note in plan.notes)


@pytest.mark.parametrize(("value", "message"), [
    ("cuda;sm_80", r"PYTORCH_ROCM_ARCH='cuda;sm_80': 'cuda' is not a known GPU target"),
    ("gfx90a;gfx1100", "mix wave32 and wave64"),
    (" ; ", "PYTORCH_ROCM_ARCH=' ; ': no GPU target given"),
])
def test_junk_pytorch_rocm_arch_is_a_usage_error(fake_machine, bare_python, value, message) -> None:
    environment = machine(fake_machine, bare_python, None, ROCM_TORCH, PYTORCH_ROCM_ARCH=value)
    with pytest.raises(UsageError, match=message) as info:
        plan_for(environment)
    assert info.value.hint


def test_hsa_override_builds_the_spoofed_target(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python,
                          "rocminfo_680M-igpu_HSA_OVERRIDE-10.3.0-reports-gfx1030_rocm-issue-5225.txt", ROCM_TORCH,
                          HSA_OVERRIDE_GFX_VERSION="10.3.0")
    plan = plan_for(environment)
    assert plan.archs == ("gfx1030",)
    assert any("HSA_OVERRIDE_GFX_VERSION" in note for note in plan.notes)


def test_no_gpu_visible_needs_arch(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, None, ROCM_TORCH)
    assert environment.platform == "rocm"  # a ROCm build host: ROCm + ROCm torch, no GPU
    with pytest.raises(EnvironmentProblem, match="no AMD GPU visible"):
        plan_for(environment)
    plan = plan_for(environment, archs="gfx942,gfx90a")
    assert (plan.archs, plan.wavefront) == (("gfx942", "gfx90a"), 64)


def test_mixed_wave_sizes_refused(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH)
    with pytest.raises(UsageError, match="mix wave32 and wave64") as info:
        plan_for(environment, archs="gfx1100,gfx90a")
    assert "--arch gfx1100" in info.value.hint


def test_unknown_arch_refused() -> None:
    with pytest.raises(UsageError, match="--arch: 'gfx9999' is not a known GPU target") as info:
        parse_arch_option("gfx9999")
    assert "gfx900, gfx902" in info.value.hint and info.value.hint.index("gfx942") < info.value.hint.index("gfx1030")
    assert parse_arch_option("gfx90a:sramecc+:xnack-; gfx942 gfx90a") == ("gfx90a", "gfx942")


@pytest.mark.parametrize(("torch", "message"), [
    (None, "PyTorch is not installed"),
    (CUDA_TORCH, "AMD GPU machine but .* has a CUDA PyTorch"),
    (CPU_TORCH, "AMD GPU machine but .* has a CPU PyTorch"),
])
def test_wrong_or_missing_torch_refused(fake_machine, bare_python, torch, message) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", torch)
    with pytest.raises(EnvironmentProblem, match=message) as info:
        plan_for(environment)
    assert "download.pytorch.org/whl/rocm6.2" in info.value.hint or torch is CPU_TORCH or torch is CUDA_TORCH


def test_rocm_older_than_recipe_refused(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1030_rocm-issue-2773.txt", ROCM_TORCH,
                          rocm_version="5.4.3")
    with pytest.raises(EnvironmentProblem, match=r"ROCm 5.4.3 is older than this recipe supports \(ROCm >= 5.7\)"):
        plan_for(environment)


@pytest.mark.parametrize(("missing", "message"), [
    ({"hipcc": None}, "hipcc not found"), ({"cxx": None}, "no C\\+\\+ compiler"),
    ({"python_headers": False}, "Python headers"),
])
def test_missing_build_tools_refused(fake_machine, bare_python, missing, message) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH)
    with pytest.raises(EnvironmentProblem, match=message):
        plan_for(environment, toolchain=dataclasses.replace(FULL_TOOLCHAIN, **missing))


def test_no_libaio_skips_async_io_with_reason(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH)
    plan = plan_for(environment, toolchain=dataclasses.replace(FULL_TOOLCHAIN, libaio_headers=False))
    (aio,) = [op for op in plan.ops if op.name == "async_io"]
    assert not aio.build and "libaio-dev" in aio.reason and plan.env["DS_BUILD_AIO"] == "0"


def test_cpu_machine(fake_machine, bare_python) -> None:
    plan = plan_for(machine(fake_machine, bare_python, None, CPU_TORCH, rocm_version=None))
    assert (plan.platform, plan.accelerator, plan.archs) == ("cpu", "cpu", ())
    assert set(plan.built_ops) == {"cpu_adam", "fused_adam", "deepspeed_shm_comm", "async_io", "pin_memory"}
    assert "PYTORCH_ROCM_ARCH" not in plan.env
    with pytest.raises(UsageError, match="--arch applies to ROCm"):
        plan_for(machine(fake_machine, bare_python, None, CPU_TORCH, rocm_version=None), archs="gfx90a")


def test_cpu_machine_without_libaio_says_why_nvme_offload_would_compile(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, None, CPU_TORCH, rocm_version=None)
    plan = plan_for(environment, toolchain=dataclasses.replace(FULL_TOOLCHAIN, libaio_headers=False))
    (aio,) = [op for op in plan.ops if op.name == "async_io"]
    assert not aio.build and "libaio headers not found" in aio.reason and "libaio-dev" in aio.reason
    assert set(plan.built_ops) == {"cpu_adam", "fused_adam", "deepspeed_shm_comm", "pin_memory"}


def test_cuda_machine(fake_machine, bare_python) -> None:
    fake_machine.tool("nvidia-smi", text="NVIDIA H100 80GB HBM3, 9.0, 81559\n")
    plan = plan_for(machine(fake_machine, bare_python, None, CUDA_TORCH, rocm_version=None))
    assert (plan.platform, plan.env["TORCH_CUDA_ARCH_LIST"], plan.env["DS_ACCELERATOR"]) == ("cuda", "9.0", "cuda")


def test_cache_key_tracks_what_changes_the_wheel(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH)
    recipe = find_recipe("deepspeed-0.19.5")
    key = make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=2)).cache_key
    assert key == make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=8)).cache_key
    other_patches = [PatchRef("0001-x.patch", "b" * 64)]
    assert key != make_plan(environment, recipe, FULL_TOOLCHAIN, other_patches, PlanOptions()).cache_key
    assert key != make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES,
                            PlanOptions(archs=("gfx1101",))).cache_key
    newer_torch = dataclasses.replace(environment, torch=dataclasses.replace(ROCM_TORCH, version="2.7.0+rocm6.3"))
    assert key != make_plan(newer_torch, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions()).cache_key



def test_the_key_and_the_differences_read_one_key_material(fake_machine, bare_python) -> None:
    """Same torch version, another HIP build of it: a new key, and `plan_differences` names it (its own field
    list once left torch_hip out). Concurrency changes neither."""
    environment = machine(fake_machine, bare_python, "rocminfo_gfx1100_rocm-issue-3949.txt", ROCM_TORCH)
    recipe = find_recipe("deepspeed-0.19.5")
    plan = make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=2))
    other_hip = dataclasses.replace(environment, torch=dataclasses.replace(ROCM_TORCH, hip="6.3.42131-fa1d09cbd"))
    rebuilt = make_plan(other_hip, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=8))
    assert plan.cache_key == cache_key(key_material(plan.to_dict())) != rebuilt.cache_key
    assert plan_differences(rebuilt.to_dict(), plan.to_dict()) == [
        'torch_hip: "6.3.42131-fa1d09cbd" here, "6.2.41134-65d174c3e" on the head']
    faster = make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=8))
    assert plan_differences(faster.to_dict(), plan.to_dict()) == []

PARALLEL_PATCHES = [*PATCHES, PatchRef("0019-setup-one-build-dir-per-op.patch", "b" * 64)]


def test_a_multi_arch_rocm_build_runs_ops_archs_and_files_at_once_through_ccache(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt", ROCM_TORCH)
    recipe = find_recipe("deepspeed-0.19.5")
    cached = dataclasses.replace(FULL_TOOLCHAIN, ccache_dir="/usr/lib/ccache", ccache="/usr/bin/ccache")
    archs = parse_arch_option("gfx90a,gfx942")
    plan = make_plan(environment, recipe, cached, PARALLEL_PATCHES, PlanOptions(archs=archs, jobs=64),
                     mem_available=256 * 1024**3)
    assert plan.concurrency is not None
    ops = len(plan.built_ops)
    assert (plan.concurrency.ops_at_once, plan.concurrency.archs_at_once) == (ops, 2)
    assert plan.env["DS_ENABLE_NINJA"] == "1" and plan.env["MAX_JOBS"] == str(plan.concurrency.jobs_per_op)
    assert plan.env["HIPCC_COMPILE_FLAGS_APPEND"] == "-parallel-jobs=2"
    assert plan.env["PYTORCH_NVCC"] == "/usr/bin/ccache /opt/rocm/bin/hipcc"  # torch leaves hipcc unwrapped
    assert plan.to_dict()["concurrency"]["ops_at_once"] == ops
    # How fast it is built is not what is built: the same wheel, the same cache entry.
    slow = make_plan(environment, recipe, FULL_TOOLCHAIN, PARALLEL_PATCHES, PlanOptions(archs=archs, jobs=1))
    assert slow.concurrency is not None and slow.concurrency.processes == 1
    assert "PYTORCH_NVCC" not in slow.env and slow.cache_key == plan.cache_key


def test_ops_build_one_after_another_without_ninja_or_the_patch(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt", ROCM_TORCH)
    recipe = find_recipe("deepspeed-0.19.5")
    no_patch = make_plan(environment, recipe, FULL_TOOLCHAIN, PATCHES, PlanOptions(jobs=8))
    assert no_patch.concurrency is not None and no_patch.concurrency.ops_at_once == 1
    assert any("lacks *-setup-one-build-dir-per-op.patch" in note for note in no_patch.notes)
    no_ninja = make_plan(environment, recipe, dataclasses.replace(FULL_TOOLCHAIN, ninja=None), PARALLEL_PATCHES,
                         PlanOptions(jobs=8))
    assert no_ninja.concurrency is not None and no_ninja.concurrency.ops_at_once == 1
    assert "DS_ENABLE_NINJA" not in no_ninja.env and any("ninja not found" in n for n in no_ninja.notes)


def test_more_jobs_than_memory_allows_is_clamped_with_the_reason(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt", ROCM_TORCH)
    plan = make_plan(environment, find_recipe("deepspeed-0.19.5"), FULL_TOOLCHAIN, PARALLEL_PATCHES,
                     PlanOptions(jobs=32), mem_available=9 * 1024**3)
    assert plan.concurrency is not None and plan.concurrency.jobs == 4 and plan.concurrency.processes <= 4
    assert any(note.startswith("--jobs 32 needs about 64 GiB") and note.endswith("using 4") for note in plan.notes)


def test_the_wheels_version_is_key_material_only_where_the_plan_has_one() -> None:
    """A plan against TheRock's wheels is keyed by their version; every other plan keeps the key it had."""
    plan = {"schema": 1, "deepspeed_version": "0.19.5", "env": {"PYTORCH_ROCM_ARCH": "gfx1100"}, "archs": ["gfx1100"]}
    assert "rocm_wheels" not in key_material(plan)
    assert cache_key(key_material({**plan, "rocm_wheels": "7.14.0"})) != cache_key(
        key_material({**plan, "rocm_wheels": "7.14.1"}))
    assert plan_differences({**plan, "rocm_wheels": "7.14.1"}, {**plan, "rocm_wheels": "7.14.0"}) == [
        'rocm_wheels: "7.14.1" here, "7.14.0" on the head']

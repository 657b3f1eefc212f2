"""TORCH_CUDA_ARCH_LIST from the user's environment is honoured like PYTORCH_ROCM_ARCH: it picks the plan's
targets (as spelled: `9.0a` stays `9.0a`), so the cache key and the receipt follow it, and a bad value is one
clear error naming the variable and the entry.

Issue 39: an H100 machine set TORCH_CUDA_ARCH_LIST=9.0a and the plan built for 9.0 (the detected capability).
The machine is replayed: nvidia-smi prints what the H100 reported; torch's facts are given (no CUDA torch here).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.fakemachine import FakeMachine

from mlstack_ds.detect import detect
from mlstack_ds.detect.environment import decide_platform
from mlstack_ds.detect.model import Environment, TorchInfo
from mlstack_ds.detect.toolchain import Toolchain
from mlstack_ds.errors import UsageError
from mlstack_ds.plan.buildplan import CUDA_ARCH_SUFFIX_PATCH, BuildPlan, PatchRef, PlanOptions, make_plan
from mlstack_ds.plan.targets import parse_cuda_arch_list, target_source_text
from mlstack_ds.recipe import find_recipe

CUDA_TORCH = TorchInfo("2.11.0+cu130", None, "13.0", ["sm_90", "sm_100", "sm_120"], 1, [])
TOOLCHAIN = Toolchain(cxx="/usr/bin/c++", hipcc=None, nvcc="/usr/local/cuda/bin/nvcc", ninja="/usr/bin/ninja",
                      ccache_dir=None, libaio_headers=True, python_headers=True)
PATCHES = [PatchRef("0001-x.patch", "a" * 64)]
SUFFIX_FIX = PatchRef(f"0022-{CUDA_ARCH_SUFFIX_PATCH}", "c" * 64)
H100_SMI = "NVIDIA H100 80GB HBM3, 9.0, 81559\n"


def h100(fake: FakeMachine, bare_python: Path, smi: str = H100_SMI, **env: str) -> Environment:
    fake.tool("nvidia-smi", text=smi)
    fake.extra_env.update(env)
    environment = detect(environ=fake.environ(), python=bare_python)
    nvidia = [g for g in environment.gpus if g.vendor == "nvidia"]
    python = dataclasses.replace(environment.python, setuptools="84.2.1", wheel_package=False)
    return dataclasses.replace(environment, torch=CUDA_TORCH, python=python,
                               platform=decide_platform([], nvidia, CUDA_TORCH, rocm_found=False))


def plan(environment: Environment, patches: list[PatchRef] = PATCHES, *, apply: bool = True) -> BuildPlan:
    return make_plan(environment, find_recipe("deepspeed-0.19.5"), TOOLCHAIN, patches,
                     PlanOptions(jobs=4, patches=apply))


def test_the_h100s_arch_list_is_the_plans(fake_machine, bare_python) -> None:
    built = plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="9.0a"), [*PATCHES, SUFFIX_FIX])
    assert (built.archs, built.env["TORCH_CUDA_ARCH_LIST"], built.targets_source) == (("9.0a",), "9.0a", "environment")
    assert target_source_text(built.targets_source, built.platform) == "TORCH_CUDA_ARCH_LIST"
    assert not [note for note in built.notes if "TORCH_CUDA_ARCH_LIST" in note]


def test_without_it_the_detected_gpus_answer(fake_machine, bare_python) -> None:
    built = plan(h100(fake_machine, bare_python))
    assert (built.archs, built.env["TORCH_CUDA_ARCH_LIST"], built.targets_source) == (("9.0",), "9.0", "detected")
    assert target_source_text(built.targets_source, built.platform) == "the detected GPUs"


def test_no_gpu_and_no_list_leave_deepspeeds_defaults(fake_machine, bare_python) -> None:
    built = plan(h100(fake_machine, bare_python, smi=""))  # torch sees a device, nvidia-smi none
    assert (built.platform, built.archs, built.targets_source) == ("cuda", (), "")
    assert "TORCH_CUDA_ARCH_LIST" not in built.env
    build_host = plan(h100(fake_machine, bare_python, smi="", TORCH_CUDA_ARCH_LIST="9.0"))
    assert (build_host.archs, build_host.targets_source) == (("9.0",), "environment")
    assert not [note for note in build_host.notes if "TORCH_CUDA_ARCH_LIST" in note]


def test_9_0_and_9_0a_are_different_wheels(fake_machine, bare_python) -> None:
    patches = [*PATCHES, SUFFIX_FIX]
    plain = plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="9.0"), patches)
    specific = plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="9.0a"), patches)
    assert plain.archs == ("9.0",) and plain.targets_source == "environment"
    assert plain.cache_key != specific.cache_key


def test_the_list_is_kept_as_spelled_and_deduplicated(fake_machine, bare_python) -> None:
    environment = h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST=" 8.0  9.0;8.0 10.0+PTX ")
    built = plan(environment)
    assert built.archs == ("8.0", "9.0", "10.0+PTX") and built.env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0+PTX"


def test_a_list_leaving_out_the_gpu_says_so(fake_machine, bare_python) -> None:
    left_out = plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="8.0;8.6"))
    assert left_out.archs == ("8.0", "8.6")
    assert any("leaves out the detected 9.0 (NVIDIA H100 80GB HBM3)" in note for note in left_out.notes)
    by_ptx = plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="8.0+PTX"))
    assert any("reaches the detected 9.0" in note and "JIT" in note for note in by_ptx.notes)


def test_suffixed_targets_are_refused_while_deepspeeds_builder_cannot_read_them(fake_machine, bare_python) -> None:
    """DeepSpeed 0.19.5's compute_capability_args does int('0a'): refused with the way out, unless the series
    carries the fix (and `--no-patches` drops it again)."""
    environment = h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="8.0 9.0a+PTX")
    with pytest.raises(UsageError, match=r"TORCH_CUDA_ARCH_LIST names 9\.0a\+PTX: DeepSpeed 0\.19\.5") as refused:
        plan(environment)
    assert refused.value.hint.startswith('export TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"')
    with pytest.raises(UsageError, match="cannot build arch- or family-specific"):
        plan(environment, [*PATCHES, SUFFIX_FIX], apply=False)
    assert plan(environment, [*PATCHES, SUFFIX_FIX]).archs == ("8.0", "9.0a+PTX")


@pytest.mark.parametrize(("value", "named", "says"), [
    ("Hopper", "'Hopper'", "is a name"),
    ("native", "'native'", "is a name"),
    ("8.0,9.0", "'8.0,9.0'", "holds a comma"),
    ("9", "'9'", "is not a compute capability"),
    ("sm_90", "'sm_90'", "is a name"),
    ("9.0+ptx", "'9.0+ptx'", "is not a compute capability"),
    ("8.0a", "'8.0a'", "arch-specific code"),
    ("9.0f", "'9.0f'", "family-specific code"),
    (" ; ", "", "no GPU target given"),
])
def test_a_bad_value_is_one_error_naming_it(value: str, named: str, says: str) -> None:
    with pytest.raises(UsageError) as bad:
        parse_cuda_arch_list(value)
    assert bad.value.message.startswith(f"TORCH_CUDA_ARCH_LIST={value!r}: {named}".rstrip())
    assert says in bad.value.message and bad.value.hint


def test_a_comma_list_gets_the_fixed_value_as_hint() -> None:
    with pytest.raises(UsageError) as bad:
        parse_cuda_arch_list("8.0,9.0")
    assert bad.value.hint == 'export TORCH_CUDA_ARCH_LIST="8.0;9.0"'


def test_a_bad_value_stops_the_plan(fake_machine, bare_python) -> None:
    with pytest.raises(UsageError, match="TORCH_CUDA_ARCH_LIST='Hopper'"):
        plan(h100(fake_machine, bare_python, TORCH_CUDA_ARCH_LIST="Hopper"))


@pytest.mark.parametrize("value", ["9.0", "9.0a", "10.0f", "12.1a+PTX", "8.6+PTX", "3.5"])
def test_what_torch_and_nvcc_accept_is_accepted(value: str) -> None:
    assert parse_cuda_arch_list(value) == (value,)

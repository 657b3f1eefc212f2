"""Which published wheel fits which machine: plans only, made by the real `make_plan` on replayed machines
(real rocminfo captures, a fake ROCm root), published as `publish` would record them. Nothing is built."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_plan import CPU_TORCH, FULL_TOOLCHAIN, PATCHES, ROCM_TORCH, machine

from mlstack_ds.detect.model import Environment
from mlstack_ds.detect.toolchain import Toolchain
from mlstack_ds.errors import EnvironmentProblem, InstallError
from mlstack_ds.index.choose import IndexChoice, Offer
from mlstack_ds.index.match import Here, label, mismatches, published_version, rank
from mlstack_ds.index.publish import published_document
from mlstack_ds.index.read import Index
from mlstack_ds.index.simple import Link
from mlstack_ds.install.pipeline import refuse_or_adopt
from mlstack_ds.plan.buildplan import BuildPlan, PlanOptions, make_plan
from mlstack_ds.plan.targets import parse_arch_option
from mlstack_ds.recipe import find_recipe

MI210 = "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"
RX7900 = "rocminfo_gfx1100_rocm-issue-3949.txt"
NO_COMPILER = Toolchain(cxx=None, hipcc=None, nvcc=None, ninja=None, ccache_dir=None, libaio_headers=False,
                        python_headers=False)
HOST = {"machine": "x86_64", "cpu_flags": ["avx", "avx2", "fma", "sse4_2"], "compiler": "g++ (Debian) 12.2.0"}
CPU_HERE = ("avx", "avx2", "avx512f", "fma", "sse4_2")


def plan(environment: Environment, archs: str | None = None, toolchain: Toolchain = FULL_TOOLCHAIN,
         optional: bool = False) -> BuildPlan:
    options = PlanOptions(archs=parse_arch_option(archs) if archs else None, jobs=4, toolchain_optional=optional)
    return make_plan(environment, find_recipe("deepspeed-0.19.5"), toolchain, PATCHES, options)


def published(built: BuildPlan, **host: Any) -> dict[str, Any]:
    """The plan file `publish` writes for a wheel of `built`."""
    version = published_version("0.19.5", built.to_dict())
    record = {"plan": built.to_dict(), "wheel_sha256": "0" * 64, "source_commit": "c" * 40, "tree_hash": "t" * 40,
              "host": {**HOST, **host}}
    return published_document(record, f"deepspeed-{version}-cp311-cp311-linux_x86_64.whl", version, "1" * 64)


def here(built: BuildPlan, cpu: tuple[str, ...] = CPU_HERE) -> Here:
    return Here(built.to_dict(), "x86_64", cpu)


@pytest.fixture
def fat_wheel(fake_machine, bare_python) -> dict[str, Any]:
    """Built on a login node for the MI210 and MI300X nodes: --arch gfx90a,gfx942 (both wave64)."""
    return published(plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH), archs="gfx90a,gfx942"))


def test_a_fat_wheel_serves_an_mi210_node(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH))
    assert node.archs == ("gfx90a",)
    assert mismatches(fat_wheel, here(node)) == []


def test_a_fat_wheel_serves_a_gfx942_node(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH, PYTORCH_ROCM_ARCH="gfx942"))
    assert node.archs == ("gfx942",)
    assert mismatches(fat_wheel, here(node)) == []


def test_a_wave64_wheel_does_not_serve_an_rx_7900(fat_wheel, fake_machine, bare_python) -> None:
    workstation = plan(machine(fake_machine, bare_python, RX7900, ROCM_TORCH))
    reasons = mismatches(fat_wheel, here(workstation))
    assert "built for wave64 targets, this machine's are wave32" in reasons
    assert "built for gfx90a, gfx942; lacks gfx1100" in reasons


def test_a_wheel_for_one_target_does_not_serve_another(fake_machine, bare_python) -> None:
    mi210_only = published(plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH)))
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH, PYTORCH_ROCM_ARCH="gfx942"))
    assert mismatches(mi210_only, here(node)) == ["built for gfx90a; lacks gfx942"]


def test_another_torch_build_is_named(fat_wheel, fake_machine, bare_python) -> None:
    newer = dataclasses.replace(ROCM_TORCH, version="2.8.0+rocm6.2.4")
    node = plan(machine(fake_machine, bare_python, MI210, newer))
    assert mismatches(fat_wheel, here(node)) == [
        "built for torch 2.7.1+rocm6.2.4 (HIP 6.2.41134-65d174c3e), the target has torch 2.8.0+rocm6.2.4 "
        "(HIP 6.2.41134-65d174c3e)"]


def test_another_python_is_named(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH)).to_dict()
    reasons = mismatches(fat_wheel, Here({**node, "python_version": "3.99.0"}, "x86_64", CPU_HERE))
    assert reasons == [f"built for Python {fat_wheel['plan']['python_version'].rsplit('.', 1)[0]}, the target is "
                       "Python 3.99"]


def test_rocm_major_minor_must_match_but_not_the_patch_release(fat_wheel, fake_machine, bare_python) -> None:
    same_minor = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH, rocm_version="6.2.1"))
    assert mismatches(fat_wheel, here(same_minor)) == []
    fat_wheel["plan"]["rocm_version"] = "6.3"  # the wheel was built against ROCm 6.3
    assert mismatches(fat_wheel, here(same_minor)) == ["built against ROCm 6.3, this machine has ROCm 6.2"]


def test_cpu_instructions_this_cpu_lacks_are_named(fake_machine, bare_python) -> None:
    cpu_plan = plan(machine(fake_machine, bare_python, None, CPU_TORCH, rocm_version=None))
    avx512 = published(cpu_plan, cpu_flags=["avx2", "avx512f", "avx512bw"])
    assert mismatches(avx512, here(cpu_plan, cpu=("avx2", "fma"))) == [
        "its CPU ops were compiled for instructions this CPU lacks: avx512bw, avx512f"]
    assert mismatches(avx512, here(cpu_plan, cpu=("avx2", "avx512bw", "avx512f"))) == []
    assert avx512["version"] == f"0.19.5+cpu.torch2.13.0.k{cpu_plan.cache_key[:8]}"


def test_a_machine_without_any_compiler_plans_and_matches(fat_wheel, fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, MI210, ROCM_TORCH)
    with pytest.raises(EnvironmentProblem, match="hipcc not found"):
        plan(environment, toolchain=NO_COMPILER)
    bare = plan(environment, toolchain=NO_COMPILER, optional=True)
    assert [message for message, _ in bare.toolchain_missing] == [
        "hipcc not found (needed to compile the ROCm ops)", f"Python headers (Python.h) missing for "
        f"{environment.python.executable}", "no C++ compiler found (none of c++, g++, clang++ on PATH)"]
    assert "async_io" not in bare.built_ops  # no libaio headers here: the wheel's op is more, not less
    assert bare.cache_key != plan(environment).cache_key
    assert mismatches(fat_wheel, here(bare)) == []


def test_a_wheel_without_an_op_this_machine_builds_does_not_fit(fake_machine, bare_python) -> None:
    environment = machine(fake_machine, bare_python, MI210, ROCM_TORCH)
    without_aio = published(plan(environment, toolchain=dataclasses.replace(FULL_TOOLCHAIN, libaio_headers=False)))
    assert mismatches(without_aio, here(plan(environment))) == [
        "lacks op(s) async_io that this machine's plan builds"]


def test_the_exact_plan_ranks_before_a_fatter_wheel(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH))
    exact = published(node)
    assert rank(exact, here(node)) < rank(fat_wheel, here(node))


def test_labels_tell_builds_apart_and_say_what_they_are_for(fat_wheel, fake_machine, bare_python) -> None:
    workstation = plan(machine(fake_machine, bare_python, RX7900, ROCM_TORCH)).to_dict()
    fat = fat_wheel["plan"]
    assert label(fat) == f"rocm6.2.wave64.gfx90a.gfx942.torch2.7.1.k{fat['cache_key'][:8]}"
    assert label(workstation) == f"rocm6.2.wave32.gfx1100.torch2.7.1.k{workstation['cache_key'][:8]}"


def test_a_plan_file_of_an_unknown_schema_fits_nothing(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH))
    assert mismatches({**fat_wheel, "schema": 99}, here(node)) == ["its plan file has schema 99, not 1"]


def test_the_published_plan_leaves_out_this_hosts_paths(fat_wheel) -> None:
    assert fat_wheel["plan"]["target_python"] == "" and fat_wheel["plan"]["path_prepend"] == []
    assert fat_wheel["host"]["compiler"] == HOST["compiler"] and fat_wheel["python_tags"] == ["cp311"]


def choice_of(offers: tuple[Offer, ...]) -> IndexChoice:
    chosen = next((o for o in offers if not o.reasons), None)
    return IndexChoice(Index("http://idx/simple", "http://idx/simple/"), offers, chosen)


def test_without_a_fitting_wheel_a_machine_without_a_compiler_says_both(fat_wheel, fake_machine,
                                                                         bare_python) -> None:
    workstation = machine(fake_machine, bare_python, RX7900, ROCM_TORCH)
    bare = plan(workstation, toolchain=NO_COMPILER, optional=True)
    offer = Offer(Link("deepspeed-x.whl", "http://idx/simple/deepspeed/deepspeed-x.whl", "0" * 64), fat_wheel,
                  tuple(mismatches(fat_wheel, here(bare))))
    with pytest.raises(EnvironmentProblem, match=r"hipcc not found \(needed to compile the ROCm ops\), and no wheel "
                       r"in the index http://idx/simple fits this machine \(deepspeed-x.whl: built for wave64"):
        refuse_or_adopt(bare, choice_of((offer,)), index_only=False)
    with pytest.raises(InstallError, match="no wheel in the index http://idx/simple fits this machine"):
        refuse_or_adopt(plan(workstation), choice_of((offer,)), index_only=True)
    assert refuse_or_adopt(plan(workstation), choice_of((offer,)), index_only=False) == plan(workstation)


def test_an_adopted_plan_is_the_wheels_with_this_machines_interpreter(fat_wheel, fake_machine, bare_python) -> None:
    node = plan(machine(fake_machine, bare_python, MI210, ROCM_TORCH), toolchain=NO_COMPILER, optional=True)
    offer = Offer(Link("deepspeed-x.whl", "http://idx/simple/deepspeed/deepspeed-x.whl", "0" * 64), fat_wheel, ())
    adopted = refuse_or_adopt(node, choice_of((offer,)), index_only=True)
    assert adopted.archs == ("gfx90a", "gfx942") and adopted.cache_key == fat_wheel["plan"]["cache_key"]
    assert adopted.prebuilt == offer.link.url and adopted.target_python == node.target_python
    assert "async_io" in adopted.built_ops and adopted.targets_source == "index"
    assert adopted.notes[-1].startswith("prebuilt wheel deepspeed-x.whl from the index: nothing is compiled here")

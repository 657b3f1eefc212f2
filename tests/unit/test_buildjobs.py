"""How a cold build's compile budget is split over ops, archs and sources, and clamped by memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.plan.buildjobs import GIB, MEMORY_RESERVE, plan_concurrency, read_mem_available


@pytest.mark.parametrize(("cpus", "ops", "archs", "platform", "expected"), [
    # (ops at once, files per op, archs at once)
    (2, 5, 0, "cpu", (2, 2, 1)),  # this machine: two ops side by side; one left alone still has both cores
    (2, 1, 0, "cpu", (1, 2, 1)),  # one op: ninja takes both cores, never more files than the budget
    (16, 10, 3, "rocm", (10, 1, 3)),  # a workstation: every op at once, each file's three archs at once
    (64, 10, 3, "rocm", (10, 4, 3)),  # a node: and four files per op
    (64, 1, 1, "rocm", (1, 64, 1)),
    (8, 0, 0, "cpu", (1, 8, 1)),  # nothing to build: no division by zero
    (1, 5, 0, "cpu", (1, 1, 1)),  # one core: sequential
])
def test_budget_split(cpus: int, ops: int, archs: int, platform: str, expected: tuple[int, int, int]) -> None:
    c = plan_concurrency(requested=None, cpus=cpus, mem_available=None, platform=platform, ops=ops, archs=archs)
    assert (c.ops_at_once, c.jobs_per_op, c.archs_at_once) == expected
    assert c.jobs == cpus and c.limit == "cpus" and not c.warning
    assert c.processes <= 2 * cpus and c.jobs_per_op <= cpus


def test_jobs_option_is_the_budget() -> None:
    c = plan_concurrency(requested=3, cpus=64, mem_available=None, platform="cpu", ops=5, archs=0)
    assert (c.jobs, c.ops_at_once, c.jobs_per_op, c.limit) == (3, 3, 2, "--jobs")
    one = plan_concurrency(requested=1, cpus=64, mem_available=None, platform="rocm", ops=5, archs=3)
    assert one.processes == 1  # --jobs 1 is the sequential build


def test_without_ninja_or_the_patch_ops_build_one_after_another() -> None:
    c = plan_concurrency(requested=None, cpus=8, mem_available=None, platform="rocm", ops=5, archs=2,
                         parallel_ops=False)
    assert (c.ops_at_once, c.jobs_per_op, c.archs_at_once) == (1, 8, 2)


def test_memory_clamps_the_default_quietly_and_a_jobs_option_with_a_warning() -> None:
    mem = MEMORY_RESERVE + 5 * GIB  # room for two hipcc compiles (2 GiB each)
    default = plan_concurrency(requested=None, cpus=64, mem_available=mem, platform="rocm", ops=12, archs=3)
    assert default.limit == "memory" and default.jobs == 2 and not default.warning
    assert default.processes <= 2  # the product is what uses memory, so it is what is bounded
    asked = plan_concurrency(requested=16, cpus=64, mem_available=mem, platform="rocm", ops=12, archs=3)
    assert asked.jobs == 2 and asked.processes <= 2
    assert asked.warning == "--jobs 16 needs about 32 GiB (2 GiB per compile) but 6.0 GiB is available: using 2"


def test_at_least_one_compile_even_when_memory_is_short() -> None:
    c = plan_concurrency(requested=None, cpus=4, mem_available=GIB // 2, platform="cpu", ops=3, archs=0)
    assert (c.jobs, c.processes) == (1, 1)


def test_mem_available_from_proc_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684136 kB\nMemFree:        15956176 kB\nMemAvailable:   22696612 kB\n")
    assert read_mem_available(meminfo) == 22696612 * 1024
    meminfo.write_text("MemTotal:       24684136 kB\n")  # kernels before 3.14 have no MemAvailable
    assert read_mem_available(meminfo) is None
    assert read_mem_available(tmp_path / "absent") is None
    assert (read_mem_available() or 0) > 0  # this machine's own

"""The paper estimate of a ROCm build's parallel run, from recorded compile lines."""

from __future__ import annotations

from mlstack_ds.rehearsal.parallel import UnitTimes, compile_units, estimate
from mlstack_ds.rehearsal.records import OpBuild, Record

TIMES = UnitTimes(host=10.0, device_per_arch=10.0, link=1.0)


def compile_line(tool: str, source: str, archs: tuple[str, ...] = ()) -> Record:
    argv = (tool, *(f"--offload-arch={a}" for a in archs), "-c", source, "-o", source + ".o")
    return Record(tool, "compile", argv, "/t/" + source + ".o", "/t")


def ops() -> dict[str, OpBuild]:
    archs = ("gfx1030", "gfx1100", "gfx1201")
    return {
        "fused_adam": OpBuild("fused_adam", "fused_adam_op.so",
                              [compile_line("c++", "a.cpp"), compile_line("hipcc", "a.hip", archs)]),
        "async_io": OpBuild("async_io", "async_io_op.so", [compile_line("c++", f"io{i}.cpp") for i in range(4)]),
        "utils": OpBuild("utils", "utils_op.so", [compile_line("c++", "u.cpp")]),
    }


def test_a_hipcc_file_is_one_unit_per_offload_arch() -> None:
    assert compile_units(ops()) == 1 + 3 + 4 + 1


def test_one_core_is_the_sum_and_more_cores_are_bounded_by_the_longest_op() -> None:
    one = estimate(ops(), TIMES, 1)
    assert one.one_core_seconds == one.seconds == 9 * 10 + 3 * 1 and one.speedup == 1.0
    many = estimate(ops(), TIMES, 64)
    # 3 ops at once, 42 compilers each: async_io's 4 files at once, fused_adam's archs at once.
    assert (many.concurrency.ops_at_once, many.concurrency.archs_at_once) == (3, 3)
    assert many.seconds == 10 + 1  # every unit at once, then the link
    assert round(many.speedup, 1) == round(93 / 11, 1)


def test_two_cores_build_two_ops_side_by_side() -> None:
    two = estimate(ops(), TIMES, 2)
    assert (two.concurrency.ops_at_once, two.concurrency.jobs_per_op, two.concurrency.archs_at_once) == (2, 1, 2)
    # fused_adam (10 + 2 x 10 + 1) and async_io (40 + 1) side by side, utils after fused_adam: 31 + 11 = 42;
    # but up to four compilers share two cores, so no faster than the work over the cores: 93 / 2
    assert two.seconds == 93 / 2

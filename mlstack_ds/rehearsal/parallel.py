"""The parallel plan of a rehearsed ROCm build, worked out on paper: compile units and the expected speed-up.

Why on paper: the rehearsal records every compile line a real ROCm build would run but compiles nothing, so
how long the build takes on 16 or 64 cores cannot be measured here. What can be counted is the work: a host
compile is one unit, a hipcc compile is one unit per `--offload-arch` (clang compiles the device code once
per target). Given a time per unit, the build is simulated as our plan runs it (buildjobs): `ops_at_once`
ops on setuptools' threads in submission order, each op's files on `jobs_per_op` ninja slots (longest
first), each hipcc file's archs `archs_at_once` at a time, then the op's link; and never faster than the
work divided by the cores (the plan may start more compilers than cores). The speed-up is the one-core
time over that, so it depends on the units' relative times, not on the machine.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlstack_ds.plan.buildjobs import BuildConcurrency, plan_concurrency
from mlstack_ds.rehearsal.records import OpBuild

GIB = 1024**3


@dataclass(frozen=True)
class UnitTimes:
    """Seconds per compile unit: a host C++ file, one offload arch of a hipcc file, one link."""

    host: float
    device_per_arch: float
    link: float


@dataclass(frozen=True)
class ParallelEstimate:
    cores: int
    concurrency: BuildConcurrency
    units: int
    one_core_seconds: float
    seconds: float

    @property
    def speedup(self) -> float:
        return self.one_core_seconds / self.seconds if self.seconds else 1.0


def compile_units(ops: Mapping[str, OpBuild]) -> int:
    """Host compiles count once, hipcc compiles once per offload arch."""
    return sum(max(1, len(c.offload_archs)) if c.is_hip else 1 for op in ops.values() for c in op.compiles)


def _file_seconds(op: OpBuild, times: UnitTimes, archs_at_once: int) -> list[float]:
    out = []
    for compile_ in op.compiles:
        if compile_.is_hip:
            archs = max(1, len(compile_.offload_archs))
            out.append(math.ceil(archs / archs_at_once) * times.device_per_arch)
        else:
            out.append(times.host)
    return out


def _op_seconds(files: Sequence[float], slots: int, link: float) -> float:
    """Longest-first onto `slots` ninja slots, then the link."""
    finish = [0.0] * max(1, slots)
    for seconds in sorted(files, reverse=True):
        heapq.heapreplace(finish, finish[0] + seconds)
    return max(finish) + link


def estimate(ops: Mapping[str, OpBuild], times: UnitTimes, cores: int) -> ParallelEstimate:
    """The build of `ops` on `cores` cores with memory to spare, as the plan would run it."""
    archs = max((len(c.offload_archs) for op in ops.values() for c in op.compiles if c.is_hip), default=0)
    concurrency = plan_concurrency(requested=None, cpus=cores, mem_available=None, platform="rocm",
                                   ops=len(ops), archs=archs)
    one_core = sum(sum(_file_seconds(op, times, 1)) + times.link for op in ops.values())
    threads = [0.0] * concurrency.ops_at_once
    for op in ops.values():  # setuptools submits in order; a free thread takes the next op
        seconds = _op_seconds(_file_seconds(op, times, concurrency.archs_at_once), concurrency.jobs_per_op,
                              times.link)
        heapq.heapreplace(threads, threads[0] + seconds)
    # The plan may start up to twice as many compilers as cores; they then share the cores.
    return ParallelEstimate(cores, concurrency, compile_units(ops), one_core, max(*threads, one_core / cores))

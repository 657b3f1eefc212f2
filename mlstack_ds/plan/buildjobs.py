"""How many compiles a cold build runs at once, and at which level (pure, no I/O but `read_mem_available`).

Why three levels: DeepSpeed's ops are many small extensions (one to a dozen sources each), so compiling
one op's sources in parallel (ninja, `MAX_JOBS`) leaves most cores idle; several ops build at once
(setuptools' `build_ext` parallel option, made safe by patch 0019), and on ROCm each source is compiled
for every `--offload-arch`, which clang can do in parallel (`-parallel-jobs`).

The rule, in `docs/benchmarks.md` ("Cold builds in parallel"):
- the budget is `--jobs` (default: the CPUs); up to twice that many compiler processes may exist, so
  that an op left alone at the end (three ops on two cores) still has every core instead of one; where
  ccache runs the compiles, only the budget of them compile at a time (build/compile_slots.py: four
  compiles on two cores took a fifth more CPU each, issue 43), the others wait for a slot;
- every process must have its memory: `MEMORY_PER_COMPILE` each (per offload arch on ROCm), so the
  process count is clamped to what is available, and `--jobs` asking for more gets a warning;
- ops at once = min(budget, ops); each op's share of the processes goes first to its archs (ROCm), then
  to its files (ninja), never more files than the budget: `--jobs 1` is a sequential build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
# Peak resident memory of one compiler process. g++ on DeepSpeed's CPU ops (torch's extension headers,
# -O3 -g): 0.9 GiB for cpu_adam (ps), 2.1 GiB for the largest process of a hand build of all five CPU ops
# (/usr/bin/time). hipcc: one clang process per offload arch holds the whole device module; ROCm's advice
# for building PyTorch is MAX_JOBS ~ RAM / 2 GiB. So 2 GiB per compile process, per arch on ROCm.
MEMORY_PER_COMPILE = {"cpu": 2 * GIB, "cuda": 2 * GIB, "rocm": 2 * GIB}
# Memory kept for everything else on the machine while the build runs.
MEMORY_RESERVE = 1 * GIB


@dataclass(frozen=True)
class BuildConcurrency:
    """Compiles at once, split over ops, archs and sources; `limit` is what bounded the total."""

    jobs: int  # the budget after clamping: compiles that may run at once
    ops_at_once: int  # setuptools build_ext parallel (ops built on threads)
    jobs_per_op: int  # ninja -j inside one op (MAX_JOBS)
    archs_at_once: int  # clang -parallel-jobs for one source's offload archs (ROCm); 1 elsewhere
    limit: str  # "cpus", "--jobs", "memory"
    warning: str = ""  # set when --jobs asked for more than memory allows

    @property
    def processes(self) -> int:
        """Compiler processes at the peak (up to twice `jobs`: see the module docstring)."""
        return self.ops_at_once * self.jobs_per_op * self.archs_at_once


def plan_concurrency(
    *,
    requested: int | None,
    cpus: int,
    mem_available: int | None,
    platform: str,
    ops: int,
    archs: int,
    parallel_ops: bool = True,
) -> BuildConcurrency:
    """Split the compile budget over ops, archs and sources. `parallel_ops` is False without ninja:
    torch's non-ninja compile swaps the shared compiler's executable per `.cu` file, which is not
    thread-safe, so ops then build one after another."""
    per_compile = MEMORY_PER_COMPILE.get(platform, 2 * GIB)
    arch_count = max(1, archs) if platform == "rocm" else 1
    budget, limit = (requested, "--jobs") if requested else (max(1, cpus), "cpus")
    processes = 2 * budget if budget > 1 else 1
    warning = ""
    if mem_available is not None:
        by_memory = max(1, (mem_available - MEMORY_RESERVE) // per_compile)
        if by_memory < budget and requested:
            warning = (f"--jobs {requested} needs about {requested * per_compile / GIB:.0f} GiB "
                       f"({per_compile / GIB:.0f} GiB per compile) but {mem_available / GIB:.1f} GiB is "
                       f"available: using {by_memory}")
        if by_memory < budget:
            budget, limit = by_memory, "memory"
        processes = min(processes, by_memory)
    ops_at_once = max(1, min(budget, ops, processes)) if parallel_ops else 1
    per_op = max(1, processes // ops_at_once)
    archs_at_once = min(arch_count, per_op)
    jobs_per_op = max(1, min(budget, per_op // archs_at_once))
    return BuildConcurrency(budget, ops_at_once, jobs_per_op, archs_at_once, limit, warning)


def read_mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes (what can be used without swapping), or None where /proc is absent."""
    return read_meminfo_bytes("MemAvailable", meminfo)


def read_meminfo_bytes(field: str, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """One /proc/meminfo field (`MemTotal`, `MemAvailable`) in bytes, or None where it is absent."""
    try:
        for line in meminfo.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None

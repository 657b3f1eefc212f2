"""Which ops `bench.py build` compares when its time is capped (pure: no I/O; tests/unit/test_bench_build.py).

Why a choice at all: the hand build (DeepSpeed's documented `DS_BUILD_*=1 pip install`) compiles one file at a
time, so on a GPU machine it cannot build the plan's ops within the GPU check's slot: with 13 CUDA ops on a
16-core H100 it had finished 3 (fused_adam, cpu_adam, pin_memory) at 245 s (issue 43). Both builds must build
the same ops for the comparison to mean anything, so with a cap the op set is cut to what the hand build is
expected to finish in its share of the cap, and the result says so.

The estimate is deliberately rough: setup.py's start-up (twice under pip) plus a fixed cost per source file,
the host compiler's files and the GPU compiler's (nvcc/hipcc, per arch) apart. The per-file costs are the
issue's numbers: a hand build of the 3-op CPU set on 2 cores, 237 s for 6 files (run 4 in docs/benchmarks.md),
rounded up; the H100 hand build, 5 files of 3 ops (one `.cu`) done before 245 s (estimated here at 190 s, the
rest of the 245 s being the fourth op it was compiling). A wrong estimate costs little: the hand build is
stopped at its share, and the result then says it did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass

# Source files per op in DeepSpeed 0.19.5 (op_builder/*.py `sources()`): (host files, GPU files). The
# GPU files of an op built on the CPU platform are its CPU sources, counted as host files there.
OP_SOURCES: dict[str, tuple[int, int]] = {
    "pin_memory": (1, 0), "utils": (1, 0), "cpu_adagrad": (1, 0), "cpu_adam": (2, 0), "cpu_lion": (2, 0),
    "deepspeed_shm_comm": (2, 0), "fused_adam": (1, 1), "fused_lion": (1, 1), "fused_lamb": (1, 1),
    "random_ltd": (1, 3), "quantizer": (1, 6), "async_io": (12, 0), "transformer": (1, 7),
    "stochastic_transformer": (1, 7), "transformer_inference": (1, 9),
}
# The order ops are taken in: the platform's default optimizer first (the op users need most), then the
# cheapest, so a small cap still compares a GPU op and a host op.
PREFERENCE = ("fused_adam", "cpu_adam", "pin_memory", "utils", "cpu_adagrad", "deepspeed_shm_comm", "cpu_lion",
              "fused_lion", "fused_lamb", "random_ltd", "quantizer", "async_io", "transformer",
              "stochastic_transformer", "transformer_inference")
# Seconds of a serial hand build: setup.py's start-up (pip runs it twice), one host file, one GPU file.
HAND_STARTUP_S = {"cpu": 25.0, "cuda": 30.0, "rocm": 30.0}
HAND_HOST_FILE_S = {"cpu": 40.0, "cuda": 25.0, "rocm": 25.0}
HAND_GPU_FILE_S = {"cpu": 40.0, "cuda": 60.0, "rocm": 60.0}
UNKNOWN_OP_FILES = (2, 2)  # an op this table does not know: counted as a large one
# The hand build's share of a capped run: ours (cold) takes about half of the hand build's wall and a one-op
# rebuild a fraction, so the hand build gets a bit more than half of the cap.
HAND_SHARE = 0.55


@dataclass(frozen=True)
class OpSet:
    """The ops both builds build, of the plan's `of`, with the estimate and why it is that set."""

    ops: tuple[str, ...]
    of: tuple[str, ...]
    hand_estimate_s: float
    reason: str

    @property
    def cut(self) -> bool:
        return len(self.ops) < len(self.of)


def hand_estimate(ops: tuple[str, ...] | list[str], platform: str) -> float:
    """Seconds a serial hand build of `ops` is expected to take on `platform` (cpu, cuda, rocm) per arch."""
    startup = HAND_STARTUP_S.get(platform, HAND_STARTUP_S["cuda"])
    host = HAND_HOST_FILE_S.get(platform, HAND_HOST_FILE_S["cuda"])
    gpu = HAND_GPU_FILE_S.get(platform, HAND_GPU_FILE_S["cuda"])
    seconds = startup
    for op in ops:
        host_files, gpu_files = OP_SOURCES.get(op, UNKNOWN_OP_FILES)
        seconds += host_files * host + gpu_files * gpu
    return seconds


def choose_ops(planned: list[str] | tuple[str, ...], platform: str, cap_s: float | None,
               asked: list[str] | None = None) -> OpSet:
    """The op set to compare: `asked` (--ops) as given, every planned op without a cap, else the planned
    ops in PREFERENCE order for as long as the hand build's estimate fits its share of the cap (one op
    at least: a comparison of nothing measures nothing)."""
    of = tuple(planned)
    if asked:
        unknown = [op for op in asked if op not in of]
        if unknown:
            raise ValueError(f"--ops {','.join(unknown)}: not in the plan for {platform} ({', '.join(of)})")
        ops = tuple(op for op in of if op in asked)
        return OpSet(ops, of, hand_estimate(ops, platform), "the ops asked for (--ops)")
    if cap_s is None:
        return OpSet(of, of, hand_estimate(of, platform), "every op of the plan (no --time-cap)")
    budget = cap_s * HAND_SHARE
    ranked = sorted(of, key=lambda op: (PREFERENCE.index(op) if op in PREFERENCE else len(PREFERENCE), op))
    chosen: list[str] = []
    for op in ranked:
        if chosen and hand_estimate([*chosen, op], platform) > budget:
            break
        chosen.append(op)
    ops = tuple(op for op in of if op in chosen)
    estimate = hand_estimate(ops, platform)
    if len(ops) == len(of):
        reason = f"every op of the plan: the hand build's estimate, {estimate:.0f} s, fits {budget:.0f} s"
    else:
        reason = (f"{len(ops)} of the plan's {len(of)} ops: a hand build of all is estimated at "
                  f"{hand_estimate(of, platform):.0f} s, over its share of the --time-cap {cap_s:.0f} s "
                  f"({budget:.0f} s); these are estimated at {estimate:.0f} s")
    return OpSet(ops, of, estimate, reason)

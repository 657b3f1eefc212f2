"""What a prebuilt wheel depends on beyond its plan: the CPU's instruction set and the compiler that built it.

Why: DeepSpeed compiles its CPU ops (cpu_adam, ...) with `-march=native`, so a wheel built on a CPU with
AVX-512 may die with SIGILL on one without. The build records these facts next to its wheel, `publish`
copies them into the published plan, and `install --index` refuses a wheel whose SIMD flags this CPU lacks.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from pathlib import Path

from mlstack_ds.errors import ToolError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import run, which

# The flags that decide whether `-march=native` code runs on another CPU (x86 SIMD and its relatives,
# Arm's SVE/ASIMD). Others (`ht`, `tsc`, `vmx`...) say nothing about the code a compiler emits.
_SIMD = re.compile(r"^(sse\w*|ssse3|avx\w*|fma\w*|f16c|bmi\d|amx\w*|vnni|vaes|vpclmulqdq|sha_ni|asimd\w*|sve\w*)$")


def simd_flags(flags: Iterable[str]) -> tuple[str, ...]:
    """The instruction-set flags among `flags`, sorted: what `-march=native` code may use."""
    return tuple(sorted({flag for flag in flags if _SIMD.match(flag)}))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """This CPU's instruction-set flags (x86 `flags`, Arm `Features`), empty when unknown."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return simd_flags(value.split())
    return ()


def compiler_version(cxx: str | None) -> str | None:
    """The first line of `CXX --version` (`g++ (Debian 12.2.0-14) 12.2.0`), None when it cannot be asked."""
    if not cxx:
        return None
    found = which(cxx.split()[-1])
    if found is None:
        return None
    try:
        result = run([str(found), "--version"], patience=WAITS["compiler version"])
    except ToolError:
        return None
    first = result.stdout.strip().splitlines()[:1]
    return first[0] if result.ok and first else None


def host_facts(cxx: str | None) -> dict[str, object]:
    """What a build records about its host next to the wheel (build.json's `host`)."""
    return {"machine": platform.machine(), "cpu_flags": list(cpu_flags()), "compiler": compiler_version(cxx)}

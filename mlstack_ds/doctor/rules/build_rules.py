"""What compiling DeepSpeed's ops needs: hipcc/ROCM_HOME, ninja, Python headers, a C++ compiler, libaio, and a
setuptools that builds wheels."""

from __future__ import annotations

import re

from mlstack_ds.detect.toolchain import CXX_FIX, HIPCC_FIX, LIBAIO_FIX, PYTHON_HEADERS_FIX
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import rocm_torch

PREBUILT_NOTE = "info when an index wheel fits this machine (doctor --index URL, or MLSTACK_DS_INDEX): nothing " \
    "is compiled then"


def _needed(inp: DoctorInput, evidence: str) -> Hit:
    """A missing build tool: the rule's severity, or info when the index has a wheel for this machine."""
    if inp.prebuilt:
        return Hit(f"{evidence}; not needed: the index wheel {inp.prebuilt} fits this machine "
                   "(install --index takes it, nothing is compiled)", severity="info")
    return Hit(evidence)


def no_hipcc(inp: DoctorInput) -> Hit | None:
    if not rocm_torch(inp) or inp.facts.tools.get("hipcc"):
        return None
    home = inp.facts.rocm_home or "none"
    return _needed(inp, f"hipcc is not on PATH nor under ROCM_PATH/ROCM_HOME (ROCm home: {home})")


def no_ninja(inp: DoctorInput) -> Hit | None:
    if inp.env.torch is None or inp.facts.tools.get("ninja"):
        return None
    return _needed(inp, "ninja is not on PATH")


def no_python_headers(inp: DoctorInput) -> Hit | None:
    include = inp.facts.python_include
    if inp.facts.python_headers or include is None:
        return None  # an unknown include dir means the target did not answer: detect warns about that
    return _needed(inp, f"Python.h not found in {include} (interpreter {inp.env.python.executable})")


def no_cxx_compiler(inp: DoctorInput) -> Hit | None:
    if inp.facts.cxx_compiler:
        return None
    if inp.facts.cxx_variable:
        return _needed(inp, f"CXX={inp.facts.cxx_variable} is not found (a build would use it)")
    return _needed(inp, "none of c++, g++, clang++ is on PATH")


def cannot_build_wheels(inp: DoctorInput) -> Hit | None:
    problem = inp.env.python.wheel_build_problem
    if problem is None:
        return None
    return _needed(inp, f"{inp.env.python.executable}: {problem}")


def no_libaio_headers(inp: DoctorInput) -> Hit | None:
    if inp.facts.libaio_headers:
        return None
    if inp.nvme_offload:
        return Hit("libaio.h not found, and the DeepSpeed config offloads to NVMe", severity="error")
    return Hit("libaio.h not found: async_io (NVMe offload) will not be built")


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-BUILD-001", severity="error", title="hipcc / ROCM_HOME not found",
        symptom="torch's cpp_extension cannot find ROCm: every HIP op fails to build or JIT.",
        fix=HIPCC_FIX,
        source="F05/F06 (ROCm paths not found; ops that need a ROCm/CUDA home crash)",
        check=no_hipcc,
        severity_note=PREBUILT_NOTE,
    ),
    Rule(
        id="MLS-BUILD-002", severity="warning", title="ninja is not installed",
        symptom="`ds_report` shows `ninja .... [FAIL]`; JIT-compiled ops cannot load "
        "(\"JIT compiled ops requires ninja\").",
        fix=("pip install ninja   # or: apt-get install ninja-build",),
        source="ds_report fixtures (`JIT compiled ops requires ninja`); DeepSpeed 0.19.5 deepspeed/env_report.py "
        "(`ninja` + 18 dots + `[FAIL]` in red when torch's is_ninja_available() is false)",
        check=no_ninja,
        severity_note=PREBUILT_NOTE,
        log_patterns=(re.compile(r"ninja \.+ \[FAIL\]"),),
    ),
    Rule(
        id="MLS-BUILD-003", severity="error", title="Python development headers are missing",
        symptom="Op builds fail with `fatal error: Python.h: No such file or directory`.",
        fix=PYTHON_HEADERS_FIX,
        source="issue #7 build prerequisites (no catalogue entry): torch's cpp_extension compiles every "
        "op against the target interpreter's headers",
        check=no_python_headers,
        severity_note=PREBUILT_NOTE,
    ),
    Rule(
        id="MLS-BUILD-004", severity="error", title="No C++ compiler",
        symptom="Every op build fails before the first file compiles.",
        fix=CXX_FIX,
        source="issue #7 build prerequisites; F04/F15 (cpu_adam and other CPU ops are compiled with "
        "the host C++ compiler)",
        check=no_cxx_compiler,
        severity_note=PREBUILT_NOTE,
    ),
    Rule(
        id="MLS-BUILD-007", severity="error", title="The target's setuptools cannot build wheels",
        symptom="DeepSpeed's build ends, after the download and the patches, in `error: invalid command "
        "'bdist_wheel'` (setuptools before 70.1 without the `wheel` package: a venv's own ensurepip copy, "
        "65.5 on Python 3.11) or `No module named 'setuptools'` (venvs of Python 3.12 and later).",
        fix=("pip install wheel   # in the target interpreter; with no setuptools at all: pip install setuptools",),
        source="measured here: `python3.11 -m venv` gives setuptools 65.5.0 without bdist_wheel, and it shadows "
        "the newer setuptools a system PyTorch's site-packages has; setuptools 70.1 release notes (bdist_wheel "
        "moved into setuptools)",
        check=cannot_build_wheels,
        severity_note=PREBUILT_NOTE,
    ),
    Rule(
        id="MLS-BUILD-005", severity="info",
        title="libaio headers are missing: async_io (NVMe offload) unavailable",
        symptom="`async_io requires the dev libaio .so object and headers but these were not found.`",
        fix=(*LIBAIO_FIX, "DeepSpeed >= 0.16.4 is needed for async_io on ROCm"),
        source="F14 (every ROCm ds_report in the corpus)",
        check=no_libaio_headers,
        log_patterns=(re.compile(r"async_io requires the dev libaio"),),
        severity_note="error when the DeepSpeed config offloads to NVMe",
    ),
)

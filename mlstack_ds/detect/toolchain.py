"""Build prerequisites on this machine: compilers, ninja, ccache, libaio headers (facts, no decisions).

The one place these facts are found: `install`'s plan and `doctor` (MLS-BUILD-*) both ask here, so
they cannot disagree about a machine, and both print the same fixes (the `*_FIX` texts below).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.runner import which

# Debian/Ubuntu/Fedora put ccache's compiler masquerade links here; prepending it to PATH makes every
# compiler call (g++, and hipcc's host compiler) go through the cache without changing command lines.
CCACHE_DIRS = (Path("/usr/lib/ccache"), Path("/usr/lib64/ccache"))
CXX_NAMES = ("c++", "g++", "clang++")
INCLUDE_PATH_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")

# The fixes `doctor` prints for a missing prerequisite and the plan gives as its refusal's hint.
HIPCC_FIX = ("install the ROCm development packages (hipcc, rocm-dev)",
             "export ROCM_PATH=/opt/rocm-<X.Y.Z>   # where bin/hipcc lives")
PYTHON_HEADERS_FIX = ("apt-get install python3-dev   # or python3.X-dev / python3-devel for the target interpreter",)
CXX_FIX = ("apt-get install build-essential   # or: dnf install gcc-c++",
           "or point CXX at the C++ compiler to use")
LIBAIO_FIX = ("apt-get install libaio-dev   # or: dnf/yum/zypper install libaio-devel",
              "mlstack-ds install   # again, to build async_io; "
              "scripts/install_deepspeed.sh --with-system-deps does both")


def hint_from(fix: tuple[str, ...]) -> str:
    """A doctor fix as a one-line hint: the commands joined, their trailing comments kept."""
    return "; ".join(step.replace("   # ", " (").rstrip() + (")" if "   # " in step else "") for step in fix)


@dataclass(frozen=True)
class Toolchain:
    cxx: str | None
    hipcc: str | None
    nvcc: str | None
    ninja: str | None
    ccache_dir: str | None
    libaio_headers: bool
    python_headers: bool | None = None  # Python.h of the target interpreter; None when unknown
    ccache: str | None = None  # the ccache executable: hipcc goes through it by name (PYTORCH_NVCC)


def probe_toolchain(
    environ: Mapping[str, str], rocm_root: Path | None, python_include: str | None = None,
    *, rocm_first: bool = False,
) -> Toolchain:
    """What is installed to build with. `rocm_first`: hipcc from `<rocm_root>/bin` before PATH (the devel
    tree of a venv's ROCm wheels, which a system hipcc on PATH must not shadow)."""
    path = environ.get("PATH", "")
    rocm_bin = [rocm_root / "bin"] if rocm_root else []
    hipcc_path = os.pathsep.join([str(rocm_root / "bin"), path]) if rocm_first and rocm_root else path
    cuda_home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    cuda_bin = [Path(cuda_home) / "bin"] if cuda_home else []
    ccache = next((str(d) for d in CCACHE_DIRS if (d / "g++").exists() or (d / "c++").exists()), None)
    return Toolchain(
        cxx=find_cxx(environ),
        hipcc=_path_str(which("hipcc", rocm_bin, path=hipcc_path)),
        nvcc=_path_str(which("nvcc", cuda_bin, path=path)),
        ninja=_path_str(which("ninja", path=path)),
        ccache_dir=ccache,
        libaio_headers=has_libaio_headers(environ),
        python_headers=(Path(python_include) / "Python.h").is_file() if python_include else None,
        ccache=_path_str(which("ccache", path=path)) if ccache else None,
    )


def find_cxx(environ: Mapping[str, str]) -> str | None:
    """The C++ compiler a build will use: `$CXX` when set (torch's cpp_extension and setuptools take it;
    `ccache g++` names g++), else the first of c++, g++, clang++ on PATH. An unresolvable `$CXX` is None:
    the build would fail on it even with g++ installed."""
    path = environ.get("PATH", "")
    named = [word for word in environ.get("CXX", "").split() if word != "ccache"]
    if environ.get("CXX", "").strip():
        return _path_str(which(named[0], path=path)) if named else None
    return next((str(found) for name in CXX_NAMES if (found := which(name, path=path))), None)


def has_libaio_headers(environ: Mapping[str, str], root: Path = Path("/")) -> bool:
    """libaio.h where the compiler looks: the default include dirs, CPATH/C_INCLUDE_PATH/
    CPLUS_INCLUDE_PATH, and CFLAGS' -I dirs (DeepSpeed's probe compiles with CFLAGS)."""
    dirs = [root / "usr" / "include", root / "usr" / "local" / "include"]
    for variable in INCLUDE_PATH_VARIABLES:
        dirs += [Path(d) for d in environ.get(variable, "").split(os.pathsep) if d]
    dirs += [Path(flag[2:]) for flag in environ.get("CFLAGS", "").split() if flag.startswith("-I")]
    return any((d / "libaio.h").is_file() for d in dirs)


def _path_str(path: Path | None) -> str | None:
    return str(path) if path else None

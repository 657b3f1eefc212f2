"""Build prerequisites on this machine: compilers, ninja, ccache, libaio headers (facts, no decisions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.runner import which

# Debian/Ubuntu/Fedora put ccache's compiler masquerade links here; prepending it to PATH makes every
# compiler call (g++, and hipcc's host compiler) go through the cache without changing command lines.
CCACHE_DIRS = (Path("/usr/lib/ccache"), Path("/usr/lib64/ccache"))
LIBAIO_HEADER_DIRS = (Path("/usr/include"), Path("/usr/local/include"))


@dataclass(frozen=True)
class Toolchain:
    cxx: str | None
    hipcc: str | None
    nvcc: str | None
    ninja: str | None
    ccache_dir: str | None
    libaio_headers: bool
    python_headers: bool | None = None  # Python.h of the target interpreter; None when unknown


def probe_toolchain(
    environ: Mapping[str, str], rocm_root: Path | None, python_include: str | None = None
) -> Toolchain:
    path = environ.get("PATH", "")
    rocm_bin = [rocm_root / "bin"] if rocm_root else []
    cuda_home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    cuda_bin = [Path(cuda_home) / "bin"] if cuda_home else []
    cxx = environ.get("CXX") or _path_str(which("c++", path=path) or which("g++", path=path))
    ccache = next((str(d) for d in CCACHE_DIRS if (d / "g++").exists() or (d / "c++").exists()), None)
    include_dirs = [Path(p) for p in environ.get("CPATH", "").split(":") if p] + list(LIBAIO_HEADER_DIRS)
    return Toolchain(
        cxx=cxx,
        hipcc=_path_str(which("hipcc", rocm_bin, path=path)),
        nvcc=_path_str(which("nvcc", cuda_bin, path=path)),
        ninja=_path_str(which("ninja", path=path)),
        ccache_dir=ccache,
        libaio_headers=any((d / "libaio.h").is_file() for d in include_dirs),
        python_headers=(Path(python_include) / "Python.h").is_file() if python_include else None,
    )


def _path_str(path: Path | None) -> str | None:
    return str(path) if path else None

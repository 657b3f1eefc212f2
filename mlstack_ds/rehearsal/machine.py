"""The fake ROCm build host a rehearsal runs on: only the absent hardware and ROCm are stood in for.

Why these pieces and no others: DeepSpeed's `setup.py` and torch's `cpp_extension` decide everything
from `torch.version.hip`, the ROCm root, `rocminfo` and the compilers they find. Those are replaced by
a start-up shim (torch reports a ROCm build of the chosen release), a ROCm root (with
`.info/version`, or distro-style without it), a replayed real `rocminfo` capture, and recording
stand-ins for hipcc and the host compiler/linker. torch's hipify, DeepSpeed's builders, setuptools and
pip run for real.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlstack_ds.errors import EnvironmentProblem

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin.py"
TORCH_SHIM = HERE / "torch_shim.py"
HOST_COMPILERS = ("gcc", "cc", "g++", "c++")
# Variables of the machine running the rehearsal that would change the fake host's answers.
HOST_VARIABLES = ("PYTORCH_ROCM_ARCH", "DS_ROCM_WAVEFRONT_SIZE", "ROCM_PATH", "ROCM_HOME", "HIP_PATH",
                  "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION",
                  "CC", "CXX", "LDSHARED", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "PYTHONPATH",
                  "MAX_JOBS", "CCACHE_DIR", "DS_BUILD_OPS", "DS_ACCELERATOR")
# ... and whole families of them: DeepSpeed's build and run switches, the ROCm runtime's, torch's JIT cache.
HOST_PREFIXES = ("DS_", "HSA_", "HIP_", "PYTORCH_ROCM", "TORCH_EXTENSIONS")


def without_host_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less the real machine's ROCm, GPU, compiler and DeepSpeed settings, so that a fake host (a
    rehearsal's, or a test's) answers for itself; the tests' fake machines use the same list."""
    return {k: v for k, v in environ.items() if k not in HOST_VARIABLES and not k.startswith(HOST_PREFIXES)}

RocmLayout = Literal["opt", "distro", "core"]  # core: 2026 system packages, /opt/rocm/core-X.Y, no ROCM_PATH


@dataclass(frozen=True)
class FakeTorch:
    """What the shim makes the build interpreter's torch report."""

    version: str  # "2.12.0+rocm6.4"
    hip: str | None  # torch.version.hip, e.g. "6.4.43482-0f2d60242"; None for a CPU or CUDA wheel
    arch_flags: str | None  # torch._C._cuda_getArchFlags(): the archs the wheel was built for
    cuda: str | None = None  # torch.version.cuda of a CUDA wheel (to rehearse the wrong torch)


@dataclass(frozen=True)
class FakeHost:
    root: Path
    rocm_root: Path
    records: Path
    environ: dict[str, str]
    real_cxx: str
    opt_rocm: Path  # what detect takes for /opt/rocm on this host


def make_fake_host(root: Path, *, rocminfo: str, rocminfo_exit: int, rocm_version: str, hip_version: str,
                   layout: RocmLayout, torch: FakeTorch, tree_mark: Path,
                   user_env: dict[str, str], base_environ: dict[str, str]) -> FakeHost:
    """Lay out the fake host under `root`; return the environment a user's shell there would have."""
    real_cc = shutil.which("gcc", path=base_environ.get("PATH")) or shutil.which("cc", path=base_environ.get("PATH"))
    real_cxx = shutil.which("g++", path=base_environ.get("PATH")) or shutil.which("c++", path=base_environ.get("PATH"))
    if not real_cc or not real_cxx:
        raise EnvironmentProblem("the rehearsal needs a real host C/C++ compiler (for DeepSpeed's library probes)",
                                 hint="apt-get install build-essential")
    bin_dir = root / "bin"
    opt_rocm = root / "opt-rocm"  # the host's /opt/rocm
    rocm_root = opt_rocm / f"core-{'.'.join(rocm_version.split('.')[:2])}" if layout == "core" else root / "rocm"
    records = root / "records"
    shim = root / "shim"
    for directory in (bin_dir, rocm_root / "bin", rocm_root / "include", records, shim):
        directory.mkdir(parents=True, exist_ok=True)
    if layout in ("opt", "core"):
        (rocm_root / ".info").mkdir()
        (rocm_root / ".info" / "version").write_text(f"{rocm_version}-0\n")
    standin = standin_script()
    for name in HOST_COMPILERS:
        _write_exe(bin_dir / name, standin)
    _write_exe(rocm_root / "bin" / "hipcc", standin)
    _write_exe(rocm_root / "bin" / "hipconfig", "#!/bin/sh\n"
               f"case \"$1\" in --version|-v) printf '%s\\n' {shlex.quote(hip_version)};; "
               f"--rocmpath|-R) printf '%s\\n' {shlex.quote(str(rocm_root))};; *) exit 1;; esac\n")
    (root / "rocminfo.out").write_text(rocminfo)
    _write_exe(bin_dir / "rocminfo",
               f"#!/bin/sh\n/bin/cat {shlex.quote(str(root / 'rocminfo.out'))}\nexit {int(rocminfo_exit)}\n")
    shutil.copy(TORCH_SHIM, shim / "sitecustomize.py")
    kept = without_host_variables(base_environ)
    environ = {
        **kept,
        "PATH": os.pathsep.join([str(bin_dir), *([] if layout == "core" else [str(rocm_root / "bin")]),
                                 base_environ.get("PATH", "")]),
        # The core-X.Y layout is found by detect under the host's /opt/rocm, with no variable naming it.
        **({} if layout == "core" else {"ROCM_PATH": str(rocm_root)}),
        "PYTHONPATH": str(shim),
        "MLSTACK_REHEARSAL_TORCH": json.dumps({"version": torch.version, "hip": torch.hip, "cuda": torch.cuda,
                                               "arch_flags": torch.arch_flags}),
        "MLSTACK_REHEARSAL_RECORDS": str(records),
        "MLSTACK_REHEARSAL_TREE_MARK": str(tree_mark),
        "MLSTACK_REHEARSAL_REAL_CC": real_cc,
        "MLSTACK_REHEARSAL_REAL_CXX": real_cxx,
        "MLSTACK_REHEARSAL_REAL_PATH": base_environ.get("PATH", ""),
        "MLSTACK_REHEARSAL_HIP_VERSION": hip_version,
        **user_env,
    }
    return FakeHost(root, rocm_root, records, environ, real_cxx, opt_rocm)


def standin_script() -> str:
    """The recording compiler stand-in as an executable script (stdlib only, run isolated from site)."""
    return f"#!{sys.executable} -SE\n" + STANDIN.read_text()


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)

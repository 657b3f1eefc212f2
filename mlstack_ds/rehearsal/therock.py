"""A stand-in for a venv that got ROCm as TheRock's Python wheels (`rocm`, `rocm-sdk-core`, `-devel`,
`-libraries`, `-device-gfx*`) and a torch that depends on them, laid out as TheRock documents it.

Why a stand-in: the real wheels come from AMD's own indexes, which these machines cannot reach (the public
index only has 0.x placeholders under those names). What a tool can see of such a venv is its layout: the
`rocm_sdk` package and its `rocm-sdk` command, `_rocm_sdk_core/.info/version`, the devel tree (expanded
or still a `_devel.tar` beside `rocm_sdk_devel`), the distributions' metadata, the trampolines in `bin/`
(on PATH only when the venv is activated), and torch's `+rocmX.Y` version. Only that is built here;
`bin/rocminfo` replays a real capture, `hipcc` is a stand-in the caller names, and torch is a stub that
reports a ROCm build (no CPU torch is imported).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.rehearsal.therock_files import STANDIN_DIR, VALUES_FILE
from mlstack_ds.runner import RunResult, run
from mlstack_ds.target_side import mlstack_purelib as purelib_module
from mlstack_ds.target_side import script

DevelState = Literal["expanded", "tarball", "absent"]
STUB_SETUPTOOLS = "84.2.1"  # the setuptools torch 2.13.0 brings: plans see an interpreter that builds wheels

@dataclass(frozen=True)
class TheRockVenv:
    root: Path
    python: Path
    site: Path
    devel_root: Path  # where the expanded devel tree is (or will be, after `rocm-sdk init`)
    rocm_version: str


def make_therock_venv(root: Path, *, rocm_version: str, torch_version: str, hip_version: str,
                      arch_flags: str, devices: Sequence[str], rocminfo: str | None,
                      devel: DevelState = "expanded", hipcc: str | None = None,
                      base_python: str = sys.executable, real_torch_site: Path | None = None) -> TheRockVenv:
    """Lay out the venv under `root` (a real venv without pip, made from `base_python`). `rocminfo` is the
    text its rocminfo prints (None: no GPU answers, the tool fails); `hipcc` the devel tree's hipcc script
    (default: one that prints its version and fails on anything else). `real_torch_site`: a site-packages
    with a real torch (and setuptools) to see through a `.pth` instead of the stub torch, for a rehearsal
    that builds (its start-up shim then makes that torch report the ROCm release)."""
    _checked([base_python, "-m", "venv", "--without-pip", str(root)], WAITS["make venv"])
    python = root / "bin" / "python"
    site = Path(_checked([str(python), script(purelib_module)], WAITS["target probe"]).stdout.strip())
    version_info = f"{rocm_version}\n"
    _standin(site / "rocm_sdk", {"__init__.py": "rocm_sdk_init.py", "__main__.py": "rocm_sdk_main.py"},
             {"version": rocm_version, "targets": ";".join(devices)})
    _dist(site, "rocm", rocm_version)
    core = site / "_rocm_sdk_core"
    _write(core / "__init__.py", "")
    _write(core / ".info" / "version", version_info)
    if rocminfo is None:
        _write(core / "bin" / "rocminfo", "#!/bin/sh\necho 'ROCk module is NOT loaded, possibly no GPU devices' >&2\n"
               "exit 1\n", executable=True)
    else:
        _write(core / "bin" / "rocminfo.out", rocminfo)
        replay = shlex.quote(str(core / "bin" / "rocminfo.out"))
        _write(core / "bin" / "rocminfo", f"#!/bin/sh\nexec /bin/cat {replay}\n", executable=True)
    _dist(site, "rocm-sdk-core", rocm_version)
    _write(site / "_rocm_sdk_libraries" / "__init__.py", "")
    _dist(site, "rocm-sdk-libraries", rocm_version)
    for arch in devices:
        _dist(site, f"rocm-sdk-device-{arch}", rocm_version)
    devel_root = site / "_rocm_sdk_devel"
    if devel != "absent":
        _write(site / "rocm_sdk_devel" / "__init__.py", "")
        _dist(site, "rocm-sdk-devel", rocm_version)
        _lay_devel(devel_root, version_info, hipcc)
        if devel == "tarball":
            _pack(devel_root, site / "rocm_sdk_devel" / "_devel.tar")
    if real_torch_site is not None:
        _write(site / "_mlstack_rehearsal_torch.pth", f"{real_torch_site}\n")
    else:
        torch = site / "torch"
        _standin(torch, {"__init__.py": "torch_init.py", "_rocm_init.py": "torch_rocm_init.py"},
                 {"version": torch_version, "hip": hip_version, "arch_flags": arch_flags,
                  "rocm_version": torch_version.split("+rocm", 1)[-1]})
        _dist(site, "torch", torch_version)
        _dist(site, "setuptools", STUB_SETUPTOOLS)  # torch's wheels require setuptools; stands in like torch
    bin_dir = root / "bin"
    _write(bin_dir / "rocm-sdk", f"#!{python}\nfrom rocm_sdk.__main__ import main\nmain()\n", executable=True)
    for tool in ("rocminfo", "amd-smi"):
        target = core / "bin" / tool
        _write(bin_dir / tool, f"#!/bin/sh\nexec {shlex.quote(str(target))} \"$@\"\n" if target.exists() else
               "#!/bin/sh\nexit 1\n", executable=True)
    # The hipcc trampoline expands the devel tree on first use, as TheRock's does.
    _write(bin_dir / "hipcc", f"#!/bin/sh\n{shlex.quote(str(bin_dir / 'rocm-sdk'))} init --quiet || exit 1\n"
           f"exec {shlex.quote(str(devel_root / 'bin' / 'hipcc'))} \"$@\"\n", executable=True)
    return TheRockVenv(root, python, site, devel_root, rocm_version)


def _lay_devel(devel_root: Path, version_info: str, hipcc: str | None) -> None:
    _write(devel_root / "__init__.py", "")
    _write(devel_root / ".info" / "version", version_info)
    _write(devel_root / "include" / "hip" / "hip_runtime.h", "/* stand-in */\n")
    _write(devel_root / "include" / "hipblas" / "hipblas.h", "/* stand-in */\n")
    _write(devel_root / "lib" / "libamdhip64.so", "")
    _write(devel_root / "bin" / "hipcc", hipcc or "#!/bin/sh\n[ \"$1\" = --version ] && "
           "{ echo 'HIP version: stand-in'; exit 0; }\necho 'hipcc stand-in: not a compiler' >&2\nexit 1\n",
           executable=True)


def _pack(directory: Path, tarball: Path) -> None:
    """Move the devel tree into the tarball `rocm-sdk init` expands (paths relative to site-packages)."""
    with tarfile.open(tarball, "w") as archive:
        archive.add(directory, arcname=directory.name)
    shutil.rmtree(directory)


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    _write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    _write(info / "RECORD", "")


def _write(path: Path, text: str, *, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(0o755)


def _standin(package: Path, files: dict[str, str], values: dict[str, str]) -> None:
    """`package` made of rehearsal/therock_files' modules (`files`: name in the package -> stand-in module) and the
    values they read, in `_standin.json` beside them."""
    for name, module in files.items():
        _write(package / name, (STANDIN_DIR / module).read_text(encoding="utf-8"))
    _write(package / VALUES_FILE, json.dumps(values, indent=1) + "\n")


def _checked(argv: list[str], patience: Patience) -> RunResult:
    """`argv` through the runner; CalledProcessError on a non-zero exit (a broken fixture, not a user's input)."""
    result = run(argv, patience=patience)
    if not result.ok:
        raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
    return result

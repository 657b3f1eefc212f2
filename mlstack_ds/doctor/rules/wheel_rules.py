"""ROCm installed as TheRock's Python wheels (`rocm`, `rocm-sdk-*`): what DeepSpeed's op builds need from them.

DeepSpeed and torch's cpp_extension were written for a ROCm tree at ROCM_HOME. With the wheels, the tree with
hipcc, headers and unversioned libraries is the `rocm[devel]` package, and only once it is expanded; the
runtime package (`_rocm_sdk_core`) and the venv root look like ROCm homes but are not. Sources: TheRock
docs/packaging/python_packaging.md, pytorch#180211, #180723, #196503, #195726, #197449, ROCm/aiter#3264,
ROCm/TheRock#1830 (the research note `rocm-as-python-wheels.md`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from mlstack_ds.detect.model import RocmWheels
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import env_value

ROCM_HOME_FIX = "export ROCM_HOME=$(rocm-sdk path --root) ROCM_PATH=$ROCM_HOME"
_TORCH_ROCM_RE = re.compile(r"\+rocm(\d+(?:\.\d+)*(?:[a-z]+\d+)?)")


def _wheels(inp: DoctorInput) -> RocmWheels | None:
    return inp.env.rocm_wheels


def torch_on_wheels(inp: DoctorInput) -> bool:
    """The target's torch is a ROCm build that loads the wheels' ROCm (detect roots `env.rocm` there then)."""
    rocm = inp.env.rocm
    return rocm is not None and rocm.kind == "wheels"


def _venv_root(inp: DoctorInput, wheels: RocmWheels) -> str | None:
    if inp.env.python.prefix:
        return inp.env.python.prefix
    return str(Path(wheels.scripts_dir).parent) if wheels.scripts_dir else None


def _rocm_sdk(wheels: RocmWheels) -> str:
    """The `rocm-sdk` command by its full path: an unactivated venv's bin is not on PATH."""
    return str(Path(wheels.scripts_dir) / "rocm-sdk") if wheels.scripts_dir else "<venv>/bin/rocm-sdk"


def _pip(inp: DoctorInput) -> str:
    return f"{inp.env.python.executable} -m pip"


def install_devel_step(inp: DoctorInput, wheels: RocmWheels) -> str:
    """`rocm[devel]` pinned to the installed ROCm wheels' own version (a devel of another version mixes two
    ROCm releases in one tree), as PyTorch's ROCm CI installs it."""
    version = wheels.version or f"$({_rocm_sdk(wheels)} version)"
    return f'{_pip(inp)} install "rocm[devel]=={version}"   # from the index the installed rocm wheels came from'


def _rocm_home_step(wheels: RocmWheels) -> str:
    return f"{ROCM_HOME_FIX}   # with the venv activated, or call {_rocm_sdk(wheels)}"


def devel_missing(inp: DoctorInput) -> Hit | None:
    wheels = _wheels(inp)
    if wheels is None or wheels.devel_installed:
        return None
    on_wheels = torch_on_wheels(inp)
    user = f"torch {inp.env.torch.version} loads it" if on_wheels and inp.env.torch else "no ROCm torch uses it yet"
    return Hit(
        f"ROCm {wheels.version or '(unknown version)'} is installed as wheels ({wheels.core or 'rocm_sdk'}) "
        f"without rocm[devel]: no hipcc, HIP/hipBLAS headers or libamdhip64.so link to build ops against; {user}",
        fix=(install_devel_step(inp, wheels), f"{_rocm_sdk(wheels)} init", _rocm_home_step(wheels)),
        severity="error" if on_wheels else "warning",
    )


def devel_not_expanded(inp: DoctorInput) -> Hit | None:
    wheels = _wheels(inp)
    if wheels is None or not wheels.devel_installed or wheels.devel_expanded:
        return None
    return Hit(
        f"rocm[devel] {wheels.version or '(unknown version)'} is installed but its devel tree is still the tarball "
        "inside rocm_sdk_devel (no _rocm_sdk_devel beside _rocm_sdk_core): nothing to build against until "
        "`rocm-sdk init`",
        fix=(f"{_rocm_sdk(wheels)} init", _rocm_home_step(wheels)),
    )


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(os.path.realpath(a)) == os.path.normpath(os.path.realpath(b))


def rocm_home_not_devel(inp: DoctorInput) -> Hit | None:
    wheels = _wheels(inp)
    if wheels is None:
        return None
    roots = {
        "the venv root (no lib/libamdhip64.so, no include/)": _venv_root(inp, wheels),
        "_rocm_sdk_core, the runtime package (no hipblas headers)": wheels.core,
    }
    wrong = [f"{name}={value} is {what}" for name in ("ROCM_HOME", "ROCM_PATH")
             if (value := env_value(inp, name))
             for what, root in roots.items() if root and _same_dir(value, root)]
    if not wrong:
        return None
    devel = wheels.devel_root if wheels.devel_expanded and wheels.devel_root else "the rocm[devel] tree"
    steps = () if wheels.devel_installed else (install_devel_step(inp, wheels),)
    return Hit("; ".join(wrong) + f"; op builds need {devel}", fix=(*steps, _rocm_home_step(wheels)))


def system_rocm_beside_wheels(inp: DoctorInput) -> Hit | None:
    system, rocm = inp.env.system_rocm, inp.env.rocm
    if system is None or rocm is None or not torch_on_wheels(inp) or system.version == rocm.version:
        return None
    where = system.root or system.version_source or "?"
    named = [name for name in ("ROCM_HOME", "ROCM_PATH")
             if system.root and (value := env_value(inp, name)) and _same_dir(value, system.root)]
    pointed = f" ({' and '.join(named)} point(s) at it: builds would use it)" if named else ""
    return Hit(
        f"a system ROCm {system.version or '(unknown version)'} ({where}) is installed beside the wheels' ROCm "
        f"{rocm.version}{pointed}; torch loads the wheels' runtime, so op builds must use the wheels' headers and "
        "hipcc, but tools that look for /opt/rocm, ROCM_PATH or hipcc on PATH first find the system one",
        fix=(ROCM_HOME_FIX + "   # with the venv activated: the wheels' devel tree, not the system ROCm",
             f"keep {system.root or 'the system ROCm'}/bin after the venv's bin on PATH (activate the venv last) "
             "and its lib/ out of LD_LIBRARY_PATH while building or running DeepSpeed"),
    )


def torch_rocm_suffix(version: str) -> str | None:
    """`2.14.1+rocm7.14.0` -> `7.14.0`; `2.12.0a0+rocm7.13.0a20260411` -> `7.13.0a20260411`."""
    match = _TORCH_ROCM_RE.search(version)
    return match.group(1) if match else None


def _release(version: str, parts: int) -> tuple[int, ...] | None:
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return (*release, 0, 0, 0)[:parts]


def torch_built_for_other_wheels(inp: DoctorInput) -> Hit | None:
    """Compare major.minor.patch (fewer when torch's suffix has fewer): nightlies of one release differ
    only in their date and are not what TheRock's `initialize_process` version check is about."""
    wheels, torch = _wheels(inp), inp.env.torch
    if wheels is None or not wheels.version or torch is None or not torch.hip:
        return None
    built_for = torch_rocm_suffix(torch.version)
    if built_for is None:
        return None
    parts = min(3, len(built_for.split(".")))
    mine, theirs = _release(built_for, parts), _release(wheels.version, parts)
    if mine is None or theirs is None or mine == theirs:
        return None
    return Hit(
        f"torch {torch.version} was built for ROCm {built_for}; the installed rocm_sdk is {wheels.version} "
        "(torch's _rocm_init.py runs rocm_sdk.initialize_process with a version check)",
        fix=(f'{_pip(inp)} install "rocm[libraries,devel]=={built_for}"   # from the same index as torch',
             f"or install the torch built for ROCm {wheels.version} from the index the rocm wheels came from"),
    )


_SOURCES = ("TheRock docs/packaging/python_packaging.md (rocm[devel], `rocm-sdk init`/`path --root`)")

RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-ROCM-005", severity="error", title="ROCm wheels without `rocm[devel]`",
        symptom="ROCm came as TheRock's wheels without the devel package: there is no hipcc, no HIP or hipBLAS "
        "headers and no libamdhip64.so link to build DeepSpeed's ops against (`rocm-sdk path --root` exits 1).",
        fix=('pip install "rocm[devel]==<the installed rocm version>"   # from the same index',
             "<venv>/bin/rocm-sdk init", ROCM_HOME_FIX),
        source=f"{_SOURCES}; pytorch#195726, #197449 (PyTorch's ROCm CI: rocm[devel]==$(rocm-sdk version), "
        "`rocm-sdk init`, ROCM_HOME from `rocm-sdk path --root`); ROCm/aiter#3264",
        check=devel_missing,
        severity_note="warning when no ROCm torch in the target loads the wheels",
    ),
    Rule(
        id="MLS-ROCM-006", severity="warning", title="`rocm[devel]` is installed but not expanded",
        symptom="pip leaves the devel tree as a tarball inside `rocm_sdk_devel`; it is expanded to "
        "`_rocm_sdk_devel` only by `rocm-sdk init`, `rocm-sdk path` or the first hipcc call. Until then torch's "
        "cpp_extension falls back to `_rocm_sdk_core` (`hipblas/hipblas.h: No such file or directory`).",
        fix=("<venv>/bin/rocm-sdk init", ROCM_HOME_FIX),
        source=f"{_SOURCES}; pytorch#196503 (warns when rocm[devel] is installed but not expanded; "
        "ROCm/pytorch#3635, #3636 for 2.13/2.14); ROCm/TheRock#1830 (`rocm-sdk init` sets no variables)",
        check=devel_not_expanded,
    ),
    Rule(
        id="MLS-ROCM-007", severity="error",
        title="ROCM_HOME/ROCM_PATH points at the venv or at `_rocm_sdk_core`, not the devel tree",
        symptom="With ROCM_HOME at the venv root the link fails (`cannot find -lamdhip64`); at `_rocm_sdk_core` "
        "the hipified ATen headers do not compile (`hipblas/hipblas.h: No such file or directory`).",
        fix=(ROCM_HOME_FIX,),
        source="pytorch#180211 (cpp_extension's ROCM_HOME became the venv root through the hipcc trampoline), "
        "#180723 (guessed _rocm_sdk_core), #196503 (prefers _rocm_sdk_devel); ROCm/aiter#3264; pytorch#195726, "
        "#197449 (PyTorch's ROCm CI exports ROCM_HOME=ROCM_PATH=$(rocm-sdk path --root))",
        check=rocm_home_not_devel,
    ),
    Rule(
        id="MLS-ROCM-008", severity="warning", title="A system ROCm of another version beside the ROCm wheels",
        symptom="torch runs on the wheels' ROCm, but DeepSpeed reads /opt/rocm/bin/rocminfo first, and "
        "cpp_extension takes ROCM_HOME/ROCM_PATH or the first hipcc on PATH: an op can be compiled against "
        "the other ROCm's headers and linked against its libraries.",
        fix=(ROCM_HOME_FIX + "   # the wheels' devel tree",
             "keep the system ROCm's bin after the venv's on PATH and its lib out of LD_LIBRARY_PATH"),
        source="research note rocm-as-python-wheels.md (DeepSpeed 0.19.x op_builder/builder.py: "
        "installed_rocm_version, get_rocm_gpu_arch use ROCM_HOME and /opt/rocm/bin/rocminfo); pytorch#180211; "
        "ROCm/aiter#2157, #2605",
        check=system_rocm_beside_wheels,
    ),
    Rule(
        id="MLS-ROCM-009", severity="error", title="torch was built for another ROCm than the installed wheels",
        symptom="torch's `+rocmX.Y` is not the installed `rocm_sdk` version: torch's `_rocm_init.py` calls "
        "`rocm_sdk.initialize_process(check_version=...)`, which warns (or fails), and torch then runs on "
        "libraries of a release it was not built against.",
        fix=('pip install "rocm[libraries,devel]==<torch\'s +rocm version>"   # from the same index',
             "or the torch built for the installed rocm version"),
        source="TheRock python_packaging.md (rocm_sdk.initialize_process); pytorch "
        "tools/amd_build/write_rocm_init.py (check_version= the rocm_sdk version torch was built with); "
        "TheRock external-builds/pytorch/build_prod_wheels.py (torch pins rocm[libraries]==<version>)",
        check=torch_built_for_other_wheels,
    ),
)

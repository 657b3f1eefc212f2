"""pip's own resolution for another machine: `pip download` for a target's Python and platform, binary only,
with torch never fetched.

Why pip and not a resolver of ours: pip is what will install these files on the offline node, and its resolver
(with `--python-version/--platform/--implementation/--abi` and `--only-binary=:all:`) is the one whose answer
matches that install. Why a stand-in for torch: the target brings its own (ROCm) torch, but client libraries
(accelerate, peft, lightning) require one, and pip would download a multi-GB CUDA build to satisfy them. A tiny
local wheel `torch==<the target's version>+mlstack.bundle.stub`, pinned by a constraint, satisfies every
`torch>=...` without a byte of torch leaving the index; it is dropped from what pip saved.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mlstack_ds.bundle.manifest import BundleTarget
from mlstack_ds.errors import FetchError, ToolError, UsageError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import run

STUB_LABEL = "mlstack.bundle.stub"
# Never bundled: the target's accelerator stack (install/wheel.py holds the same names when it installs).
NEVER_BUNDLED = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"})


@dataclass(frozen=True)
class TorchStub:
    """The stand-in torch: a directory pip finds it in, and a constraint file that allows nothing else."""

    find_links: Path
    constraint: Path
    version: str


def make_torch_stub(directory: Path, torch_version: str) -> TorchStub:
    """A metadata-only wheel `torch-<public version>+mlstack.bundle.stub` in `directory`, and its constraint."""
    try:
        public = Version(torch_version).public
    except InvalidVersion:
        raise UsageError(f"--torch {torch_version!r} is not a version", hint="e.g. --torch 2.7.1") from None
    version = f"{public}+{STUB_LABEL}"
    directory.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                            "Summary: mlstack-ds bundle stand-in: the target brings its own torch\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: mlstack-ds\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},sha256={_record_digest(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    constraint = directory / "torch-constraint.txt"
    constraint.write_text(f"torch=={version}\n", encoding="utf-8")
    return TorchStub(directory, constraint, version)


def _record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}


def platforms_for(platform: str) -> list[str]:
    """Every platform tag a machine with `platform` installs, as the `--platform` options pip needs: a glibc
    manylinux tag also takes each older manylinux (and its legacy alias), which pip 23 does not infer itself
    (asked for manylinux_2_36 only, it refused msgpack's manylinux_2_28 wheel)."""
    for legacy, minor in _LEGACY.items():
        if platform.startswith(legacy + "_"):
            platform = f"manylinux_2_{minor}_{platform.removeprefix(legacy + '_')}"
    found = _MANYLINUX.match(platform)
    if not found or found.group(1) != "2":
        return [platform]
    newest, arch = int(found.group(2)), found.group(3)
    oldest = 5 if arch in ("x86_64", "i686") else 17
    tags = []
    for minor in range(newest, oldest - 1, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        tags += [f"{legacy}_{arch}" for legacy, at in _LEGACY.items() if at == minor]
    return tags


def download_argv(python: str, requirements: Sequence[str], dest: Path, target: BundleTarget,
                  stub: TorchStub) -> list[str]:
    """The `pip download` command for one group of requirements: wheels only, for the target's interpreter and
    platform (pip itself expands a manylinux tag to the older ones it implies), torch held to the stand-in."""
    return [python, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
            "--python-version", target.python_version,
            *[arg for tag in platforms_for(target.platform) for arg in ("--platform", tag)],
            "--implementation", target.implementation, "--abi", target.python_tag,
            "--constraint", str(stub.constraint), "--find-links", str(stub.find_links),
            "--disable-pip-version-check", "--progress-bar", "off", *requirements]


def pip_download(python: str, requirements: Sequence[str], dest: Path, target: BundleTarget,
                 stub: TorchStub) -> list[Path]:
    """Download `requirements` and everything they need for `target` into `dest`; the files saved, torch's
    stand-in (and anything of NEVER_BUNDLED, which the stub's constraint should already keep out) left out."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        result = run(download_argv(python, requirements, dest, target, stub), patience=WAITS["pip download"])
    except ToolError as exc:
        raise FetchError(f"pip could not run: {exc.message}", hint="install pip into this Python") from exc
    if not result.ok:
        raise FetchError(f"pip download for {target.describe()} failed: {pip_error(result.stderr + result.stdout)}",
                         hint="check the requirement exists as a wheel for that Python and platform, and pip's "
                         "index configuration (pip config list); nothing was added to the bundle's manifest")
    saved = []
    for path in sorted(dest.iterdir()):
        if not path.is_file():
            continue
        if canonicalize_name(project_of(path.name)[0]) in NEVER_BUNDLED:
            path.unlink()
            continue
        saved.append(path)
    return saved


def project_of(filename: str) -> tuple[str, str]:
    """(name, version) from a wheel's or sdist's file name (`pydantic_core-2.41.5-cp312-...whl`)."""
    if filename.endswith(".whl"):
        name, version = filename.split("-")[:2]
        return name, version
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    name, _, version = stem.rpartition("-")
    return name, version


def pip_error(output: str) -> str:
    """pip's most specific error line (its last lines are often a generic note)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if errors:
        return errors[0].removeprefix("ERROR:").strip()
    return lines[-1] if lines else "no output"

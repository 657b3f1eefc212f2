"""Can an interpreter build DeepSpeed's wheel? The build runs setuptools' `bdist_wheel`, which setuptools
has had itself only since 70.1; before, the `wheel` package adds it. A venv gets the setuptools its
Python's ensurepip bundles (65.5 on 3.11, none at all from 3.12), and that copy shadows a newer one the
venv sees through --system-site-packages: DeepSpeed's build then ends, after the download and the patches,
in `error: invalid command 'bdist_wheel'` (or `No module named 'setuptools'`).

One rule for the target probe's facts (the plan refuses early, doctor reports it) and for
scripts/install_deepspeed.sh, which calls `main()` in the venv's Python to learn what to install there.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

BDIST_WHEEL_SINCE = (70, 1)


def wheel_build_problem(setuptools: str | None, wheel_package: bool) -> str | None:
    """Why an interpreter with this setuptools version (None: none) cannot build wheels, or None."""
    if wheel_package:
        return None
    if setuptools is None:
        return "it has no setuptools (venvs of Python 3.12 and later come without it)"
    try:
        release = Version(setuptools).release
    except InvalidVersion:
        return None
    if release < BDIST_WHEEL_SINCE:
        return f"its setuptools {setuptools} has no bdist_wheel (before setuptools 70.1 the `wheel` package adds it)"
    return None


def fix_package(setuptools: str | None) -> str:
    """What to pip install: setuptools when there is none (a current one has bdist_wheel), else `wheel`."""
    return "setuptools" if setuptools is None else "wheel"


def this_interpreter() -> tuple[str | None, bool]:
    """(setuptools version, whether `wheel` is installed) as this interpreter's `import` would find them."""
    try:
        setuptools: str | None = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        setuptools = None
    names = {(dist.metadata["Name"] or "").lower() for dist in metadata.distributions()}
    return setuptools, "wheel" in names


def main() -> int:
    """Print the package this interpreter needs to build wheels (nothing when it can); exit 0 either way."""
    setuptools, wheel_package = this_interpreter()
    if wheel_build_problem(setuptools, wheel_package):
        print(fix_package(setuptools))
    return 0

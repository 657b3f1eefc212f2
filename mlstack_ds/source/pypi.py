"""The `pypi` source: the sdist through pip itself, so the user's pip configuration applies.

Why pip and not a direct HTTP request: sites reach the package index through mirrors, proxies,
custom CAs and credentials that are already configured for pip (pip.conf, PIP_* variables).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mlstack_ds.errors import FetchError, ToolError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import run


def pip_download_sdist(package: str, requirement: str, into: Path, python: str = sys.executable) -> Path:
    """Download the sdist of `requirement` into the empty directory `into`; return the file.

    `--no-binary <package>` rather than `:all:`: pip reads the sdist's metadata in an isolated build
    environment, and `:all:` would force *that* environment's setuptools to be built from source too,
    which fails on mirrors that carry only wheels of build tools.
    """
    argv = [python, "-m", "pip", "download", "--no-deps", "--no-binary", package,
            "--disable-pip-version-check", "--progress-bar", "off", requirement, "-d", str(into)]
    try:
        result = run(argv, patience=WAITS["pip fetch"])
    except ToolError as exc:
        raise FetchError(f"pip could not run: {exc.message}", hint="install pip into this Python") from exc
    if not result.ok:
        raise FetchError(
            f"pip download {requirement} failed: {_pip_error(result.stderr + result.stdout)}",
            hint="check pip's index/proxy configuration (pip config list), or use another --source",
        )
    files = sorted(p for p in into.iterdir() if p.is_file())
    if len(files) != 1:
        names = ", ".join(p.name for p in files) or "nothing"
        raise FetchError(f"pip download {requirement} produced {names}, expected one sdist",
                         hint="report this; pip's behaviour may have changed")
    return files[0]


def _pip_error(output: str) -> str:
    """pip's most specific error line (its final lines are often a generic "note: ...")."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if errors:
        return errors[-1].removeprefix("ERROR:").strip()
    return lines[-1] if lines else "no output"

"""`mlstack-ds bundle` for real (pip downloads from the package index), as the integration tests make bundles:
for this machine's Python and platform unless told otherwise, the torch of the test venv's pin (never bundled).
tests/integration/conftest.py makes one per session (`made_bundle`), shared by every test that only reads it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .cli import CliResult, run_cli
from .pins import TORCH_VERSION

TORCH = TORCH_VERSION  # "2.13.0": the version of the test venv's pin, as --torch takes it


def make_bundle(to: Path, sdist: Path, *args: str) -> CliResult:
    """`mlstack-ds bundle --to TO --source SDIST --torch TORCH --json ARGS`, run to the end."""
    return run_cli("bundle", "--to", to, "--source", sdist, "--torch", TORCH, "--json", *args, columns=200,
                   timeout=900)


def no_network() -> list[str]:
    """`unshare -n`: a fresh network namespace with only a down loopback, so nothing can be fetched."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not allowed here ({probe.stderr.decode().strip()}): needs root or user namespaces")
    return ["unshare", "-n"]

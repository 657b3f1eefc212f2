"""`mlstack-ds bundle` for real (pip downloads from the package index), as the integration tests make bundles:
for this machine's Python and platform unless told otherwise, the torch of the test venv's pin (never bundled).
tests/integration/conftest.py makes one per session (`made_bundle`), shared by every test that only reads it."""

from __future__ import annotations

import shutil
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


def without_wheel(made: Path, copy: Path, project: str) -> Path:
    """A copy of the bundle `made` at `copy` with `project`'s wheel removed (the wheel's path in the copy)."""
    shutil.copytree(made, copy, dirs_exist_ok=True)
    (removed,) = (copy / "simple" / project).glob("*.whl")
    removed.unlink()
    return removed


# Printed on stderr by `network_namespace()`'s shell before its command starts: the routes it has (0: none out).
ROUTES_LINE = "mlstack-tests: routes in this network namespace:"


def unshare_refusal() -> str | None:
    """Why this machine will not make a network namespace (`unshare -n`: root or user namespaces), or None."""
    try:
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if probe.returncode == 0:
        return None
    return probe.stderr.decode().strip() or f"exit {probe.returncode}"


def no_network() -> list[str]:
    """`unshare -n`: a fresh network namespace with only a down loopback, so nothing can be fetched."""
    refusal = unshare_refusal()
    if refusal is not None:
        pytest.skip(f"unshare -n is not allowed here ({refusal}): needs root or user namespaces")
    return ["unshare", "-n"]


def network_namespace() -> tuple[str, ...]:
    """The prefix that runs a command in a new network namespace with loopback up (verify's ranks talk over it)
    and nothing else, saying its route count on stderr first; () where namespaces cannot be made."""
    if unshare_refusal() is not None:
        return ()
    # Absolute paths: the command may run with a PATH of its own (one without compilers, say).
    unshare, sh, ip, wc = (shutil.which(name) or name for name in ("unshare", "sh", "ip", "wc"))
    script = f'{ip} link set lo up && echo "{ROUTES_LINE} $({ip} route show | {wc} -l)" >&2 && exec "$@"'
    return (unshare, "-n", sh, "-c", script, "network-namespace")

"""Two hosts for the multi-node tests (tests/two_hosts.py): network namespaces with their own sshd.

`two_hosts_shared` is the usual cluster: both nodes see the same file system (an NFS home), so the target
venv and the tool are at the same paths everywhere. `node_local_hosts` gives each node its own copy of a
venv at one common path that only that node sees (a mount namespace), which forces the copy paths.
The CLI runs on the first host (`head_cli`), as a user logged in there would run it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from two_hosts import TwoHosts, missing, two_hosts

REPO_ROOT = Path(__file__).resolve().parents[2]


def _skip_without_harness() -> None:
    why = missing()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def two_hosts_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    _skip_without_harness()
    with two_hosts(tmp_path_factory.mktemp("two-hosts")) as hosts:
        yield hosts


@pytest.fixture
def node_local_hosts(tmp_path: Path) -> Iterator[Callable[[Path], AbstractContextManager[TwoHosts]]]:
    """`node_local_hosts(venv)`: two hosts on which `venv`'s path holds a copy of it of each node's own."""
    _skip_without_harness()

    def start(venv: Path) -> AbstractContextManager[TwoHosts]:
        copies = {}
        for name in ("mls-node-a", "mls-node-b"):
            copies[name] = tmp_path / f"{name}-venv"
            subprocess.run(["cp", "-a", str(venv), str(copies[name])], check=True)
        return two_hosts(tmp_path / "hosts", node_local={n: {venv: c} for n, c in copies.items()})

    yield start
    for name in ("mls-node-a", "mls-node-b"):
        shutil.rmtree(tmp_path / f"{name}-venv", ignore_errors=True)


def head_cli(hosts: TwoHosts, *args: str | Path, timeout: float = 900,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mlstack-ds ARGS` run on the first host (its network, mounts and name), the tool from this checkout."""
    return hosts.run_on(hosts.hosts[0], [sys.executable, "-m", "mlstack_ds", *args], timeout=timeout,
                        env={**os.environ, **(env or {}), "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)},
                        cwd=REPO_ROOT)

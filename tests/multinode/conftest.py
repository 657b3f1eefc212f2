"""Two hosts for the multi-node tests (tests/support/two_hosts.py): network namespaces with their own sshd;
`slurm`: a Slurm cluster on two such hosts (tests/support/slurm_cluster.py).

`two_hosts_shared` is the usual cluster: both nodes see the same file system (an NFS home), so the target
venv and the tool are at the same paths everywhere. `node_local_hosts` gives each node its own copy of a
venv at one common path that only that node sees (a mount namespace), which forces the copy paths.
The CLI runs on the first host (`head_cli` in tests/support/two_hosts.py), as a user logged in there would.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from support import slurm_cluster as slurm_harness
from support.bundles import make_bundle
from support.cli import run_cli
from support.e2e import Target
from support.slurm_cluster import SlurmCluster, slurm_cluster
from support.two_hosts import NODE_NAMES, REPO_ROOT, TwoHosts, missing, two_hosts


def _skip_without_harness() -> None:
    why = missing()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def two_hosts_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    _skip_without_harness()
    with two_hosts(tmp_path_factory.mktemp("two-hosts")) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A two-node Slurm cluster on two hosts of its own (tests/support/slurm_cluster.py), idle at the start."""
    why = slurm_harness.missing()
    if why:
        pytest.skip(why)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def base_venv(installed_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed target's venv without DeepSpeed (the tool's own uninstall), copied once per module: the
    install tests' starting point (torch, DeepSpeed's requirements and the HF clients stay: the hosts have no
    package index, and pip must find every requirement satisfied)."""
    venv = tmp_path_factory.mktemp("nodes-base") / "venv"
    subprocess.run(["cp", "-a", str(installed_target.venv), str(venv)], check=True)
    done = run_cli("uninstall", "--python", venv / "bin" / "python", env={"PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    return venv


@pytest.fixture
def target(base_venv: Path, tmp_path: Path) -> Path:
    """A fresh copy of the base venv for one test. Hard links: install, rollback and uninstall only add
    and remove files (pip never rewrites torch's in place), so the base stays clean and the copy is cheap."""
    venv = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(base_venv), str(venv)], check=True)
    return venv


@pytest.fixture
def warm_cache(installed_target: Target, tmp_path: Path) -> Path:
    """A cache of this test's own holding the session's wheel (the cache entry, nothing else): the head's
    build is a cache hit and each node installs in seconds."""
    cache = tmp_path / "cache"
    shutil.copytree(installed_target.cache / "wheels", cache / "wheels")
    return cache


@pytest.fixture(scope="session")
def offline_bundle(deepspeed_sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real bundle for this machine (`bundle --source` the cached sdist; about 30 s), for every `--offline`
    test of the multi-node tests: do not modify it (copy it)."""
    to = tmp_path_factory.mktemp("offline") / "bundle"
    done = make_bundle(to, deepspeed_sdist)
    assert done.returncode == 0, done.stderr[-3000:]
    return to


@pytest.fixture
def node_local_hosts(tmp_path: Path) -> Iterator[Callable[..., AbstractContextManager[TwoHosts]]]:
    """`node_local_hosts(venv=None)`: two hosts, each with a scratch directory of its own at one common path
    (`scratch_dir(hosts)`: give it to the CLI as TMPDIR, and what it writes there is on that node only,
    like a node-local /tmp) and, with `venv`, its own copy of that venv at the venv's path
    (`own_hostnames`: see tests/support/two_hosts.py). `first_node_only`: directories the first node (where
    `head_cli` runs) sees as they are and the others as an empty directory of their own (a node-local
    cache). `hardlinks`: the venv copies are `cp -al` (seconds, not minutes, for a torch venv), for tests
    that only add and remove files in them (pip does; nothing may be changed in place)."""
    _skip_without_harness()
    made: list[Path] = []

    def start(venv: Path | None = None, own_hostnames: bool = True, first_node_only: Sequence[Path] = (),
              hardlinks: bool = False) -> AbstractContextManager[TwoHosts]:
        scratch = tmp_path / "scratch"
        scratch.mkdir(exist_ok=True)
        mounts: dict[str, dict[Path, Path]] = {}
        for name in NODE_NAMES:
            own_scratch = tmp_path / f"{name}-scratch"
            own_scratch.mkdir(exist_ok=True)
            mounts[name] = {scratch: own_scratch}
            if venv is not None:
                copy = tmp_path / f"{name}-venv"
                subprocess.run(["cp", "-al" if hardlinks else "-a", str(venv), str(copy)], check=True)
                made.append(copy)
                mounts[name][venv] = copy
            if name != NODE_NAMES[0]:
                for index, path in enumerate(first_node_only):
                    own = tmp_path / f"{name}-own-{index}"
                    own.mkdir(exist_ok=True)
                    mounts[name][path] = own
        return two_hosts(tmp_path / "hosts", node_local=mounts, names=NODE_NAMES, own_hostnames=own_hostnames)

    yield start
    for copy in made:
        shutil.rmtree(copy, ignore_errors=True)

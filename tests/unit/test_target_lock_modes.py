"""Where each test runs under xdist and how it holds the installed target (tests/conftest.py: xdist_group,
target_lock_mode): the multi-node tests only copy or run it, so they share it with the readers instead of
stopping them for the half hour they run, in two groups of their own, one per harness, off the serial group
that installs and changes the target. A test that changes the target (install into it, roll it back) holds
it alone."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

PLUGIN = '''
import json, os
def pytest_collection_finish(session):
    (tests_conftest,) = [p for p in session.config.pluginmanager.get_plugins() if hasattr(p, "target_lock_mode")]
    out = {item.nodeid: [tests_conftest.target_lock_mode(item), tests_conftest.xdist_group(item)]
           for item in session.items}
    with open(os.environ["LOCK_MODES_OUT"], "w") as f:
        json.dump(out, f)
'''


def collected(tmp_path: Path, *paths: str) -> dict[str, list]:
    (tmp_path / "lock_modes_plugin.py").write_text(PLUGIN)
    out = tmp_path / "modes.json"
    env = {**os.environ, "LOCK_MODES_OUT": str(out), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "lock_modes_plugin",
                           "-p", "no:cacheprovider", "-n", "2", *paths], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_multinode_tests_share_the_target_and_changes_hold_it_alone(tmp_path: Path) -> None:
    modes = collected(tmp_path, "tests/multinode", "tests/e2e/test_install_e2e.py", "tests/e2e/test_index_e2e.py")
    multinode = {k: v for k, v in modes.items() if k.startswith("tests/multinode/")}
    holding = {k: mode for k, (mode, _) in multinode.items() if mode is not None}
    assert len(holding) >= 20, holding  # the install, verify and bench tests over both transports
    assert set(holding.values()) == {fcntl.LOCK_SH}, {k: m for k, m in holding.items() if m != fcntl.LOCK_SH}
    slurm = {k for k, (_, group) in multinode.items() if group == "nodes-over-slurm"}
    assert {group for _, group in multinode.values()} == {"nodes-over-ssh", "nodes-over-slurm"}
    assert "tests/multinode/test_slurm_cluster.py::test_cluster_is_up_with_both_nodes_idle" in slurm
    assert not any(k.startswith("tests/multinode/test_install_hostfile.py") for k in slurm)
    rollback = modes["tests/e2e/test_install_e2e.py::test_rollback_then_reinstall_from_cache"]
    assert rollback == [fcntl.LOCK_EX, "installed-targets"]
    index = [v for k, v in modes.items() if k.startswith("tests/e2e/test_index_e2e.py::")]
    assert index and all(v == [fcntl.LOCK_SH, "tests/e2e/test_index_e2e.py"] for v in index), index

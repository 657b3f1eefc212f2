"""Stale torch JIT locks, with real processes: torch's own FileBaton takes the lock in a child, the
scan sees the child as owner, then the child is killed with SIGKILL (what the OOM killer or a cancelled
job does) and the same lock has no owner. The lock layout is checked against torch's own
`_get_build_directory`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlstack_ds.doctor.jitlocks import describe_age, extensions_root, scan_jit_locks

HOLD_LOCK = """
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
assert baton.try_acquire()
print("locked", flush=True)
time.sleep(120)
"""


def ext_env(tmp_path: Path) -> dict[str, str]:
    return {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "HOME": str(tmp_path)}


def test_lock_held_by_torch_filebaton_then_orphaned_by_sigkill(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    build_dir = tmp_path / "ext" / "cpu_adam"
    build_dir.mkdir(parents=True)
    lock = build_dir / "lock"
    child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    children.append(child)
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"

    held = scan_jit_locks(ext_env(tmp_path))
    [entry] = held.locks
    assert (entry.path, entry.op) == (str(lock), "cpu_adam")
    assert child.pid in entry.owners
    assert held.stale == ()

    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert lock.exists()  # FileBaton.release never ran
    orphaned = scan_jit_locks(ext_env(tmp_path))
    assert [lock.path for lock in orphaned.stale] == [str(lock)]


@pytest.mark.parametrize("how", ["cwd", "cmdline"])
def test_a_build_running_in_the_op_directory_owns_its_lock(
    tmp_path: Path, children: list[subprocess.Popen[str]], how: str
) -> None:
    """ninja runs with cwd=<build dir>; the compilers it starts name files in it."""
    build_dir = tmp_path / "ext" / "fused_adam"
    build_dir.mkdir(parents=True)
    (build_dir / "lock").touch()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    if how == "cwd":
        child = subprocess.Popen(sleeper, cwd=build_dir)
    else:
        child = subprocess.Popen([*sleeper, str(build_dir / "multi_tensor_adam.cuda.o")])
    children.append(child)
    deadline = time.monotonic() + 60  # a loaded machine starts it slowly
    while True:  # the child's /proc entries appear once it has started
        [entry] = scan_jit_locks(ext_env(tmp_path)).locks
        if child.pid in entry.owners or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert child.pid in entry.owners


def test_default_root_is_where_torch_builds(tmp_path: Path) -> None:
    """Without TORCH_EXTENSIONS_DIR, torch uses <XDG cache>/torch_extensions/py<XY>_<device>/<op>."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    probe = "import torch.utils.cpp_extension as c; print(c._get_build_directory('cpu_adam', False))"
    build_dir = Path(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                    check=True).stdout.strip())
    (build_dir / "lock").touch()
    scan = scan_jit_locks({"XDG_CACHE_HOME": env["XDG_CACHE_HOME"], "HOME": str(tmp_path)})
    assert scan.extensions_root == str(build_dir.parent.parent)
    assert [lock.path for lock in scan.stale] == [str(build_dir / "lock")]
    assert extensions_root({"HOME": str(tmp_path)}) == Path(os.path.realpath(tmp_path / ".cache" / "torch_extensions"))


def test_no_extensions_dir_and_age(tmp_path: Path) -> None:
    assert scan_jit_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path / "absent")}).locks == ()
    lock = tmp_path / "ext" / "op" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (1000.0, 1000.0))
    [entry] = scan_jit_locks(ext_env(tmp_path), now=1000.0 + 3 * 3600 + 5).locks
    assert describe_age(entry.age_s) == "3 h"
    assert [describe_age(s) for s in (5, 90, 7200 - 1, 3 * 86400)] == ["5 s", "1 min", "119 min", "3 days"]

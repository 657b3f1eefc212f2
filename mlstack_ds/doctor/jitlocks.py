"""Find torch JIT build locks left behind by a killed build, and say whether anything still owns them.

What the lock is (torch 2.13, `torch/utils/cpp_extension.py` `_jit_compile` and
`torch/utils/file_baton.py`): before building an op, `load()` creates `<build dir>/lock` with
`os.open(path, O_CREAT | O_EXCL)` and keeps that descriptor open until the build ends, then closes it
and deletes the file (`FileBaton.release`, in a `finally`). Every other process that wants the same op
loops `while os.path.exists(lock): sleep(0.1)`, forever and silently (torch passes no
`warn_after_seconds`). A build killed by SIGKILL, the OOM killer or a cancelled job never reaches the
`finally`, so the file stays and every later `deepspeed.initialize` that loads the op hangs
(pytorch/pytorch#189245). The file holds nothing: no pid, no host.

The build dir is `$TORCH_EXTENSIONS_DIR/<op>`, or, without it,
`<realpath of $XDG_CACHE_HOME or ~/.cache>/torch_extensions/py<XY>_<rocmNNN|cuNNN|cpu>/<op>`
(`_get_build_directory`). Both layouts are scanned (`*/lock` and `*/*/lock`), so the locks of every
interpreter and torch build sharing the cache are found.

What can be known about an owner, on this machine, from `/proc`:
* the process holding the lock is the one with an open descriptor on it (`/proc/<pid>/fd/*`);
* ninja runs with the build dir as its working directory, and the compilers it starts inherit it
  (`/proc/<pid>/cwd`), or name files in it on their command line (`/proc/<pid>/cmdline`).
A lock none of these point to has no live owner here. What cannot be known: processes of other users
whose `/proc` entries this user may not read (counted in `unreadable`; the cache is per user, so they
are unlikely owners), and builds on other hosts when the cache is on a shared file system.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JitLock:
    path: str
    op: str
    age_s: float
    owners: tuple[int, ...]  # pids holding it open or building in its directory

    @property
    def stale(self) -> bool:
        return not self.owners


@dataclass(frozen=True)
class JitLockScan:
    extensions_root: str
    locks: tuple[JitLock, ...] = ()
    unreadable: int = 0  # processes whose /proc entries could not be read

    @property
    def stale(self) -> tuple[JitLock, ...]:
        return tuple(lock for lock in self.locks if lock.stale)


def extensions_root(environ: Mapping[str, str]) -> Path:
    """torch's extensions root for this user (the parent of the `py<XY>_<device>` folders)."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"])
    home = environ.get("HOME") or str(Path.home())
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return Path(os.path.realpath(os.path.join(cache, "torch_extensions")))


def scan_jit_locks(environ: Mapping[str, str], proc: Path = Path("/proc"), now: float | None = None) -> JitLockScan:
    """Every `lock` under the extensions root, with its age and its live owners per `proc`."""
    root = extensions_root(environ)
    found = sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})
    if not found:
        return JitLockScan(str(root))
    now = time.time() if now is None else now
    processes, unreadable = _processes(proc)
    locks = []
    for lock in found:
        try:
            age = max(0.0, now - lock.stat().st_mtime)
        except OSError:
            continue  # released while we looked
        build_dir = str(lock.parent.resolve())
        lock_path = str(lock.resolve())
        owners = tuple(pid for pid, (fds, cwd, cmdline) in processes.items()
                       if lock_path in fds or _inside(cwd, build_dir) or build_dir in cmdline)
        locks.append(JitLock(str(lock), lock.parent.name, age, owners))
    return JitLockScan(str(root), tuple(locks), unreadable)


def _inside(path: str | None, directory: str) -> bool:
    return path is not None and (path == directory or path.startswith(directory + os.sep))


def _processes(proc: Path) -> tuple[dict[int, tuple[set[str], str | None, str]], int]:
    """pid -> (open file targets, cwd, command line) for every process whose entries we may read."""
    table: dict[int, tuple[set[str], str | None, str]] = {}
    unreadable = 0
    try:
        pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return table, 0
    for pid in pids:
        base = proc / str(pid)
        try:
            fds = {_readlink(fd) for fd in (base / "fd").iterdir()}
            cwd = os.readlink(base / "cwd")
            cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # exited meanwhile, or a descriptor closed while listed
            continue
        table[pid] = (fds, cwd, cmdline)
    return table, unreadable


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except FileNotFoundError:  # closed between the listing and now
        return ""


def describe_age(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} days"

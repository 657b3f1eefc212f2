"""One change at a time per environment: an exclusive `flock` on `<prefix>/share/mlstack-ds/install.lock`.

Why a lock in the environment and not in the cache or /tmp: it is the target that two installs would
interleave in (two pips swapping DeepSpeed's files, two receipts written in the wrong order), whatever
tool process or cache each one uses. `flock` is released by the kernel when the last holder exits, so a
killed install never leaves a stale lock; the pip an install starts inherits the descriptor (`fd`), so
a pip that outlives a `kill -9` of the tool keeps the environment locked until it has finished writing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import EnvironmentProblem, InstallError

POLL_S = 0.25


def lock_path(prefix: str | Path) -> Path:
    return Path(prefix) / "share" / "mlstack-ds" / "install.lock"


@dataclass(frozen=True)
class TargetLock:
    fd: int  # inherited by the pip that changes the environment (runner.run's pass_fds)
    waited: bool  # another change held it first: what the caller probed before may be out of date


def describe_holder(prefix: str | Path) -> str:
    """`pid N`, from the pid the holder wrote into the lock file; says so when that process is gone (a pip
    it started, or a process it forked, still holds the lock)."""
    try:
        pid = int(lock_path(prefix).read_text(encoding="ascii").strip() or "0")
    except (OSError, ValueError):
        return "pid unknown"
    if pid <= 0:
        return "pid unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"pid {pid}, which has ended; a process it started still runs"
    except PermissionError:
        pass
    return f"pid {pid}"


def is_locked(prefix: str | Path) -> bool:
    """Whether a change is running now (for `status`): someone holds the lock."""
    try:
        fd = os.open(lock_path(prefix), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def target_lock(prefix: str | Path, python: str, *, timeout_s: float | None = None,
                waiting: Callable[[str], None] = lambda _msg: None) -> Iterator[TargetLock]:
    """Hold the environment's lock for the block. Held elsewhere: say so once (`waiting`) and wait, at most
    `timeout_s` seconds (None: as long as it takes; 0: refuse at once), polling so Ctrl-C still works."""
    path = lock_path(prefix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create the install lock {path}: {exc.strerror or exc}",
                                 hint="install into an environment you can write to (a venv of your own)") from exc
    try:
        waited = _acquire(fd, prefix, python, timeout_s, waiting)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield TargetLock(fd, waited)
    finally:
        os.close(fd)  # releases the lock, unless a child still has the descriptor


def _acquire(fd: int, prefix: str | Path, python: str, timeout_s: float | None,
             waiting: Callable[[str], None]) -> bool:
    started = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return told
        except BlockingIOError:
            pass
        holder = describe_holder(prefix)
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            raise InstallError(
                f"another mlstack-ds install into {python} ({holder}) is still running"
                + (f" after {timeout_s:g} s" if timeout_s else ""),
                hint="let it finish (or stop it), then run this again; --lock-timeout SECONDS waits longer")
        if not told:
            limit = f" (at most {timeout_s:g} s: --lock-timeout)" if timeout_s is not None else ""
            waiting(f"waiting for another mlstack-ds install into {python} ({holder}) to finish{limit}")
            told = True
        time.sleep(POLL_S)

"""Find DeepSpeed's CPU all-reduce segments left in /dev/shm, and say whether anything still uses them.

What the segment is (DeepSpeed 0.19.5, `csrc/cpu/comm/shm_interface.cpp` `initialize` and
`csrc/cpu/comm/shm.cpp` `shm_initialize`): on the CPU accelerator every rank loads the `shm_comm` op
(`deepspeed/comm/torch.py`, `TorchBackend.__init__`); when all ranks are local (`LOCAL_SIZE`, set by
DeepSpeed's launcher, equals the world size) each rank creates
`/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>` with `shm_open` and
writes its whole workspace into it (69206024 bytes, 66 MiB), then opens and maps the other ranks'
segments. The descriptors stay open and the mappings stay until the process exits; `shared_close`
(the only `shm_unlink`) is never called, so the files outlive every run. Under the same address and
port a later job reuses them; every other port or rank count adds 66 MiB of RAM per rank.

"Owner gone", soundly, asked twice:
* the kernel: a write lease (`fcntl(F_SETLEASE, F_WRLCK)`) is granted only when no other open file
  refers to the file, and a mapping keeps its open file alive after the descriptor is closed; so a
  granted lease means no process anywhere has the segment open or mapped, whoever it belongs to and
  whatever we may read of it. It needs the segment's owner (or CAP_LEASE) and `fs.leases-enable`; the
  lease is dropped at once (a rank opening the segment meanwhile waits that long, not more).
* `/proc`: the pids that map it (`/proc/<pid>/maps`, by device and inode, or by path) or hold it open
  (`/proc/<pid>/fd/*`), to name the users. Segments are listed *before* processes are read, so a
  rank starting meanwhile is seen holding its segment (the creating rank holds it from creation on).
A segment is leaked when no process uses it and the kernel granted the lease. When the lease cannot
be asked (another user's segment, no lease support), `/proc` alone decides, and only when every
process that could hold it was inspected: a process running as the segment's owner (the file is mode
0600) whose entries could not be read makes the segment `unknown`, never leaked. Every process
that could not be read is counted in `unreadable`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

SEGMENT_PREFIX = "deepspeed_allreduce_buffer_"
_DELETED = " (deleted)"


@dataclass(frozen=True)
class ShmSegment:
    path: str
    size: int
    uid: int
    users: tuple[int, ...]  # pids that map it or hold it open
    busy: bool | None = None  # the kernel's answer (a write lease refused); None: it could not be asked
    unknown: bool = False  # a process of its owner could not be inspected

    @property
    def leaked(self) -> bool:
        if self.users or self.busy:
            return False
        return self.busy is False or not self.unknown


@dataclass(frozen=True)
class ShmScan:
    shm_dir: str
    segments: tuple[ShmSegment, ...] = ()
    unreadable: int = 0  # processes whose maps or descriptors could not be read

    @property
    def leaked(self) -> tuple[ShmSegment, ...]:
        return tuple(s for s in self.segments if s.leaked)


@dataclass(frozen=True)
class _Process:
    files: frozenset[tuple[int, int]]  # (st_dev, st_ino) of every mapped or open file
    paths: frozenset[str]


def scan_shm_segments(shm_dir: Path, proc: Path = Path("/proc")) -> ShmScan:
    """Every DeepSpeed all-reduce segment in `shm_dir`, with the live processes that use it per `proc`."""
    found: list[tuple[Path, os.stat_result]] = []
    try:
        entries = sorted(p for p in shm_dir.iterdir() if p.name.startswith(SEGMENT_PREFIX))
    except OSError:
        return ShmScan(str(shm_dir))
    for path in entries:
        try:
            info = path.lstat()
        except OSError:
            continue  # removed while we looked
        if stat.S_ISREG(info.st_mode):
            found.append((path, info))
    if not found:
        return ShmScan(str(shm_dir))
    processes, blind = _processes(proc)
    blind_uids = {uid for uids in blind.values() for uid in uids}
    segments = []
    for path, info in found:
        key, text = (info.st_dev, info.st_ino), str(path)
        users = tuple(sorted(pid for pid, p in processes.items() if key in p.files or text in p.paths))
        segments.append(ShmSegment(text, info.st_size, info.st_uid, users, busy=in_use_by_kernel(path),
                                   unknown=info.st_uid in blind_uids))
    return ShmScan(str(shm_dir), tuple(segments), len(blind))


def in_use_by_kernel(path: Path) -> bool | None:
    """True when some process has `path` open or mapped, False when none has, None when the kernel
    could not be asked (not the owner, no lease support, the file went away)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as exc:
        return True if exc.errno in (errno.EAGAIN, errno.EBUSY) else None
    else:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def _processes(proc: Path) -> tuple[dict[int, _Process], dict[int, frozenset[int]]]:
    """pid -> what it maps and holds open, for the processes we may read; and pid -> uids for the
    ones we may not (their status is world-readable, their maps and descriptors are not)."""
    table: dict[int, _Process] = {}
    blind: dict[int, frozenset[int]] = {}
    try:
        pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return table, blind
    for pid in pids:
        base = proc / str(pid)
        try:
            uids = _uids((base / "status").read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue  # exited meanwhile
        try:
            files, paths = _mapped(base / "maps")
            fd_files, fd_paths = _open_files(base / "fd")
        except PermissionError:
            blind[pid] = uids
            continue
        except OSError:
            continue  # exited meanwhile
        table[pid] = _Process(files | fd_files, paths | fd_paths)
    return table, blind


def _uids(status: str) -> frozenset[int]:
    """Real, effective, saved and file-system uid from `/proc/<pid>/status`."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return frozenset(int(field) for field in line.split()[1:])
    return frozenset()


def _mapped(maps: Path) -> tuple[frozenset[tuple[int, int]], frozenset[str]]:
    """`address perms offset major:minor inode path` lines; device numbers are hex."""
    files, paths = set(), set()
    for line in maps.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[4] == "0":
            continue  # anonymous memory
        major, _, minor = fields[3].partition(":")
        try:
            files.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
        except ValueError:
            continue
        if len(fields) == 6:
            paths.add(fields[5].removesuffix(_DELETED))
    return frozenset(files), frozenset(paths)


def _open_files(fd_dir: Path) -> tuple[frozenset[tuple[int, int]], frozenset[str]]:
    files, paths = set(), set()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed between the listing and now
        if not target.startswith("/"):
            continue  # socket:[...], pipe:[...], anon_inode:...
        paths.add(target.removesuffix(_DELETED))
        if SEGMENT_PREFIX in target:  # stat only what may be a segment (it follows the link)
            try:
                info = fd.stat()
            except OSError:
                continue
            files.add((info.st_dev, info.st_ino))
    return frozenset(files), frozenset(paths)


def describe_size(size: int) -> str:
    mib = size / 1024**2
    return f"{mib:.0f} MiB" if mib >= 1 else f"{size} bytes"

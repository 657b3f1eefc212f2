"""ccache's prefix command during a build (build/compile_slots.py): take one of the build's compile slots,
then become the compiler, which holds the slot until it exits. Standard library only: copied beside the
build with the target interpreter as its `#!` line; ccache runs it as `PREFIX COMPILER ARGS...`.

Why: a cold build runs up to twice `--jobs` compilers (two ops at once, each op's ninja with its share), so
that an op left alone at the end still has every core; while all ops run, that is four compilers on two
cores, and each compile then takes a fifth more CPU than alone (issue 43). With slots, only `--jobs` of
them compile at a time, and an op left alone takes every slot the others gave back.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

SLOTS = "MLSTACK_COMPILE_SLOTS"  # the directory of slot files, one per compile that may run at once
POLL_S = 0.02  # a freed slot waits this long at most for a compiler that is waiting for one


def take_slot(directory: str) -> int | None:
    """A descriptor holding one slot's lock (None: no slots to take, run at once). Waits while all are held."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    if not names:
        return None
    fds: list[int] = []
    try:
        for name in names:
            fds.append(os.open(os.path.join(directory, name), os.O_RDWR))
    except OSError:  # the build's staging going away under a waiting compile: it runs, unslotted
        for fd in fds:
            os.close(fd)
        return None
    first = os.getpid() % len(fds)  # waiting compilers try the slots in different orders
    order = fds[first:] + fds[:first]
    while True:
        for fd in order:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            for other in fds:
                if other != fd:
                    os.close(other)
            return fd
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("mlstack_compile_slot: no compiler to run\n")
        return 2
    held = take_slot(os.environ.get(SLOTS, ""))
    if held is not None:
        os.set_inheritable(held, True)  # the compiler, and what it starts, keep the lock until they exit
    if os.sep in argv[0]:
        os.execv(argv[0], argv)
    os.execvp(argv[0], argv)
    return 127  # not reached: exec replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

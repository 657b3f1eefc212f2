"""Stand-in for `ninja` while early compiles run (build/early_compile.py): wait for the early ninja of the
same op directory, then become the real ninja. Standard library only: copied beside the build with the
target interpreter as its `#!` line, and found first on PATH by torch's cpp_extension, which runs `ninja`
by name in each op's build directory.

Why: the early ninja compiles a changed source in that directory, from the same build.ninja, while
DeepSpeed's setup.py starts. Two ninjas in one directory would compile that object twice and both write
its log; waiting for the first leaves the second an object that its log says is up to date.
"""

from __future__ import annotations

import fcntl
import os
import sys

LOCK_NAME = ".mlstack-early-compile.lock"
REAL_NINJA = "MLSTACK_REAL_NINJA"


def build_directory(argv: list[str]) -> str:
    """The directory ninja will work in: `-C DIR` (also `-CDIR`), else the current one."""
    for index, arg in enumerate(argv):
        if arg == "-C" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("-C") and len(arg) > 2:
            return arg[2:]
    return os.getcwd()


def wait_for_early_ninja(directory: str) -> None:
    """Return once no early ninja holds `directory`'s lock (at once when there is no lock file)."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # the early ninja holds it exclusively until it exits
    finally:
        os.close(fd)


def real_ninja() -> str | None:
    """$MLSTACK_REAL_NINJA (set by the build), else the first other `ninja` on PATH."""
    named = os.environ.get(REAL_NINJA, "")
    if os.path.isabs(named):
        return named
    here = os.path.dirname(os.path.realpath(__file__))
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, "ninja")
        if directory and os.path.realpath(directory) != here and os.access(candidate, os.X_OK):
            return candidate
    return None


def main(argv: list[str]) -> int:
    real = real_ninja()
    if real is None:
        sys.stderr.write(f"ninja (mlstack-ds stand-in): no real ninja ({REAL_NINJA} unset, none on PATH)\n")
        return 127
    if "--version" not in argv and "-t" not in argv:
        wait_for_early_ninja(build_directory(argv))
    os.execv(real, [real, *argv])
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

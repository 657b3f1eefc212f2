"""A legacy tree's wheel through setuptools' PEP 517 hook: `python -u mlstack_build_wheel.py OUT`, run in the
tree with the target interpreter, prints `built NAME.whl`.

Why not pip: a tree without pyproject.toml (every DeepSpeed sdist) is built by setuptools' legacy backend,
and pip runs its setup.py twice, once for the metadata and once for the wheel. DeepSpeed's setup.py imports
torch, probes the compilers and asks py-cpuinfo (a subprocess of a second) for each CPU op every time:
about 10 s of a cold build, on one core, before any op compiles. The wheel needs only the second run,
PEP 517's `build_wheel` hook, which is all `python -m build --no-isolation --wheel` calls.
"""

from __future__ import annotations

import os
import sys


def build_wheel(out: str) -> str:
    """The wheel's file name, built into `out` from the tree in the current directory."""
    from setuptools import build_meta
    return build_meta.__legacy__.build_wheel(out)


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this build ran
    before) puts the current directory, the tree, there. Kept so: the build imports what it did."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main(argv: list[str]) -> int:
    search_like_python_c()
    print("built", build_wheel(argv[0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

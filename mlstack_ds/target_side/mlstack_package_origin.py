"""Which package an interpreter imports, and from where: `python - NAME` prints NAME's `__version__` and the
real path of its package file.

cluster/tool.py sends this file's text to a node for `mlstack_ds`, run with
the same interpreter and PYTHONPATH a remote `mlstack-ds` would get, so the node proves it runs this very
tool. The name comes as an argument: this module imports nothing of mlstack_ds itself.
"""

from __future__ import annotations

import importlib
import os
import sys


def origin(name: str) -> str:
    """`VERSION REALPATH` of the package `name` as this interpreter imports it."""
    module = importlib.import_module(name)
    return f"{module.__version__} {os.path.realpath(module.__file__ or '')}"


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this script ran
    before) and `python -` (how a node gets it) put the current directory there. Kept so, whichever way it
    was started."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main(argv: list[str]) -> int:
    search_like_python_c()
    print(origin(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The wheel platform tags a node's pip takes, best first, on one line: `python -` on the node (doctor
--offline sends this file's text in a here-document to mlstack-ds's own interpreter there, which has
packaging; the target's may not).
"""

from __future__ import annotations

import os
import sys


def platform_tags() -> list[str]:
    from packaging.tags import platform_tags as tags
    return list(tags())


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this script ran
    before) and `python -` (how a node gets it) put the current directory there. Kept so, whichever way it
    was started."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main() -> int:
    search_like_python_c()
    print(" ".join(platform_tags()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

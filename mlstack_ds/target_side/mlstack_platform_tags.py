"""The wheel platform tags a node's pip takes, best first, on one line: `python -` on the node (doctor
--offline sends this file's text in a here-document to mlstack-ds's own interpreter there, which has
packaging; the target's may not).
"""

from __future__ import annotations

import sys


def platform_tags() -> list[str]:
    from packaging.tags import platform_tags as tags
    return list(tags())


def main() -> int:
    print(" ".join(platform_tags()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

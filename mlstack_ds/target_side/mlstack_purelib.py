"""An interpreter's site-packages (sysconfig's `purelib`), on one line: `python mlstack_purelib.py`.

The build rehearsal lays stand-in packages into a venv it made and reads a real torch's site through a
`.pth`; both need the directory as that interpreter computes it.
"""

from __future__ import annotations

import sys
import sysconfig


def purelib() -> str:
    return sysconfig.get_paths()["purelib"]


def main() -> int:
    print(purelib())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One TCP connect from a node, as a rank connects to the rendezvous (MASTER_ADDR:PORT):
`python - HOST PORT SECONDS` (doctor --slurm sends this file's text in a here-document) prints `ok` or why
not; SECONDS comes from the tool's table of waits (patience.WAITS["rendezvous connect"]), which a node
without mlstack_ds cannot import.
"""

from __future__ import annotations

import socket
import sys


def connect(host: str, port: int, timeout_s: float) -> str:
    """`ok`, or the error's class and message."""
    try:
        socket.create_connection((host, port), timeout_s).close()
    except OSError as exc:
        return type(exc).__name__ + ": " + str(exc)
    return "ok"


def main(argv: list[str]) -> int:
    print(connect(argv[0], int(argv[1]), float(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

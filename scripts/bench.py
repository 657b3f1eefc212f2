#!/usr/bin/env python3
"""Benchmarks of what users wait for. Subcommands live in their own modules (scripts/bench_<name>.py).

    python scripts/bench.py install [--json-out FILE] [--markdown-out FILE]
    python scripts/bench.py build [--ops OP,...] [--json-out FILE] [--markdown-out FILE]
    python scripts/bench.py verify [--python PY --jit-python PY] [--json-out FILE]
    python scripts/bench.py verify --python PY --added CHECK,... [--runs N] [--json-out FILE]
    python scripts/bench.py rehearsal [--source SDIST] [--repeat N] [--json-out FILE]
    python scripts/bench.py multinode --python PY [--runs N] [--install-python PY --cache-dir DIR]
    python scripts/bench.py integrity [--runs N] [--python PY] [--json-out FILE] [--markdown-out FILE]
    python scripts/bench.py slurm --python PY [--runs N] [--only CHECKS] [--json-out FILE] [--markdown-out FILE]
    python scripts/bench.py index [--sdist FILE] [--json-out FILE] [--markdown-out FILE]
    python scripts/bench.py offline [--sdist FILE] [--warm-cache DIR] [--json-out FILE] [--markdown-out FILE]
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {"install": "bench_install", "build": "bench_build", "verify": "bench_verify",
               "rehearsal": "bench_rehearsal", "multinode": "bench_multinode", "integrity": "bench_integrity",
               "slurm": "bench_slurm", "index": "bench_index",
               "offline": "bench_offline"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SUBCOMMANDS:
        sys.stderr.write(f"usage: bench.py {{{','.join(SUBCOMMANDS)}}} [options]\n")
        return 2
    module = importlib.import_module(SUBCOMMANDS[sys.argv[1]])
    return int(module.main(sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())

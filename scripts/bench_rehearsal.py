"""Benchmark of the ROCm build rehearsal: one rehearsal (goal < 60 s here) and the whole matrix (goal
< 5 min in CI), as run by the tests (two rehearsals at a time).

    python scripts/bench.py rehearsal [--source SDIST] [--cache-dir DIR] [--repeat 3] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _repo import REPO

from mlstack_ds.recipe import find_recipe
from mlstack_ds.rehearsal.matrix import ROWS, spec_for
from mlstack_ds.rehearsal.run import rehearse, violations
from mlstack_ds.source.cache import default_cache_dir
from mlstack_ds.source.fetch import parse_source_spec

CAPTURES = (REPO / "tests" / "fixtures" / "real", REPO / "tests" / "patches" / "fixtures")


def find_capture(name: str) -> Path:
    return next(d / name for d in CAPTURES if (d / name).is_file())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py rehearsal")
    parser.add_argument("--source", default="pypi")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    recipe, source = find_recipe("deepspeed-0.19.5"), parse_source_spec(args.source)
    cache = args.cache_dir or default_cache_dir()
    python = Path(sys.executable)
    single = spec_for(ROWS[1], find_capture)  # the guide's RX 7900 XTX, ROCm 6.4, torch 2.13

    def run(spec):  # type: ignore[no-untyped-def]
        return rehearse(spec, recipe, source, python=python, fetch_cache=cache)

    singles = []
    for _ in range(args.repeat):
        result = run(single)
        assert result.outcome == "built" and not violations(result), result.error
        singles.append(result.seconds)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(run, [spec_for(row, find_capture) for row in ROWS]))
    matrix_wall = time.monotonic() - started
    report = {"cores": os.cpu_count(), "single_s": singles, "single_median_s": statistics.median(singles),
              "matrix_rows": len(rows), "matrix_wall_s": round(matrix_wall, 1),
              "matrix_row_s": {r.spec.name: round(r.seconds, 1) for r in rows},
              "matrix_sound": all(r.outcome == "built" and not violations(r) for r in rows)}
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["matrix_sound"] else 1

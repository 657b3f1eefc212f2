#!/usr/bin/env python3
"""Benchmark `mlstack-ds doctor --json` on this machine and record it in docs/benchmarks.md.

What users wait for is the whole command; most of it is the target interpreter importing torch
(detect's probe), so the same run also times `python -c "import torch"` as the baseline and
reports doctor's own overhead on top of it. Medians of a few runs, since this machine is noisy.

    python scripts/bench_doctor.py [--runs 5] [--python PATH] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from _repo import REPO
from benchdoc import replace_section

BENCHMARKS = REPO / "docs" / "benchmarks.md"
SECTION = "## doctor"
TARGET_S = 3.0


def time_once(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def time_alternating(first: list[str], second: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Alternate the two commands so that both see the same background load."""
    a, b = [], []
    for _ in range(runs):
        a.append(time_once(first))
        b.append(time_once(second))
    return a, b


def render_section(result: dict) -> str:
    rows = [
        ("`mlstack-ds doctor --json`", result["doctor_s"]),
        ('baseline: `python -c "import torch"`', result["import_torch_s"]),
    ]
    table = "\n".join(
        f"| {name} | {statistics.median(d):.2f} | {min(d):.2f} | {max(d):.2f} |" for name, d in rows
    )
    overhead = statistics.median(result["doctor_s"]) - statistics.median(result["import_torch_s"])
    verdict = "meets" if statistics.median(result["doctor_s"]) < TARGET_S else "misses"
    return (
        f"{SECTION}\n\n"
        f"`scripts/bench_doctor.py`, {result['runs']} runs each, {result['when']}, {result['machine']}, "
        f"target interpreter {result['python']}, load average {result['load_before']:.1f} before / "
        f"{result['load_after']:.1f} after ({os.cpu_count()} cores).\n\n"
        "| command | median s | min s | max s |\n|---|---|---|---|\n"
        f"{table}\n\n"
        f"doctor's own overhead over the torch import: {overhead:.2f} s (median difference). "
        f"The median {verdict} the {TARGET_S:.0f} s target; the torch import in detect's probe "
        "dominates, so the time is bounded below by it.\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="target interpreter (default: this one)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    doctor = [sys.executable, "-m", "mlstack_ds", "doctor", "--json", "--python", args.python]
    load_before = os.getloadavg()[0]
    doctor_s, import_torch_s = time_alternating(doctor, [args.python, "-c", "import torch"], args.runs)
    result = {
        "runs": args.runs,
        "python": args.python,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
        "doctor_s": doctor_s,
        "import_torch_s": import_torch_s,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=2))
    if not args.no_write:
        existing = BENCHMARKS.read_text(encoding="utf-8") if BENCHMARKS.exists() else "# Benchmarks\n"
        BENCHMARKS.write_text(replace_section(existing, SECTION, render_section(result)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

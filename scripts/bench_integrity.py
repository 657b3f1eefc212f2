#!/usr/bin/env python3
"""Benchmark the integrity check `status`, `doctor` and every `install` run: hash each installed file
against the wheel's RECORD.

    python scripts/bench.py integrity [--runs N] [--python PY] [--json-out FILE] [--markdown-out FILE]

Measures `check_files` on a synthetic install the size of DeepSpeed with its op libraries (1,500 files,
30 MB), and, with `--python`, on the DeepSpeed that venv has installed. A speed goal (well under a
second on an idle machine) lives here, not in a timed test: a loaded CI machine is no measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import _repo  # noqa: F401  (the repository and the tests' support package on sys.path)
from benchdoc import replace_section
from support.installs import synthetic_install

from mlstack_ds.installed.integrity import check_files

HEADING = "## status: the integrity check"


def installed_record(python: str) -> Path:
    code = ("import importlib.metadata as m; "
            "print(next(f.locate() for f in m.distribution('deepspeed').files if f.name == 'RECORD'))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def measure(record: Path, runs: int) -> dict[str, object]:
    times, checked = [], 0
    for _ in range(runs):
        check = check_files(record)
        times.append(check.seconds)
        checked = check.checked
    size = sum(p.stat().st_size for p in record.parent.parent.rglob("*") if p.is_file())
    return {"files": checked, "megabytes": round(size / 2**20, 1), "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times)}


def markdown(rows: dict[str, dict[str, object]], runs: int, load: tuple[float, float]) -> str:
    lines = [HEADING, "",
             f"`scripts/bench_integrity.py`, {runs} runs each, {date.today()}, {platform.machine()}, CPython "
             f"{platform.python_version()}, load average {load[0]:.1f} before / {load[1]:.1f} after "
             f"({os.cpu_count()} cores). The files are in the page cache after the first run, as they are when "
             "`status` follows an install.", "",
             "| install | files | MB | median s | min s | max s |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['files']} | {row['megabytes']} | {row['median_s']:.3f} | "
                     f"{row['min_s']:.3f} | {row['max_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py integrity")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--python", help="a venv's python with DeepSpeed installed by mlstack-ds")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        rows["synthetic (1,500 files, 30 MB)"] = measure(synthetic_install(Path(scratch)), args.runs)
    if args.python:
        rows["DeepSpeed 0.19.5 as installed"] = measure(installed_record(args.python), args.runs)
    load = (load_before, os.getloadavg()[0])
    if args.json_out:
        args.json_out.write_text(json.dumps({"runs": args.runs, "load": load, "rows": rows}, indent=2) + "\n")
    if args.markdown_out:
        doc = args.markdown_out.read_text() if args.markdown_out.exists() else ""
        args.markdown_out.write_text(replace_section(doc, HEADING, markdown(rows, args.runs, load)))
    sys.stdout.write(markdown(rows, args.runs, load))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

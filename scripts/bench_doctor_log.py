#!/usr/bin/env python3
"""Benchmark `mlstack-ds doctor --log` on a generated ~700 MB build log: time and peak memory.

Why: a 714 MB log used to take 51 s and 1.8 GB (the whole file read, decoded and split into a list of
lines). The log is now matched block by block. This script measures, each in a fresh interpreter so
peak RSS (`ru_maxrss`) belongs to one run only:

* `stream`: `match_log_stream` (what `--log` runs) on the file;
* `whole`: the previous implementation (`match_log` of commit 835b364 on `read_text()`), same rules;
* `cli`: the whole `python -m mlstack_ds doctor --json --log FILE` (detect + facts + rules + log),
  time only (its peak RSS is the larger of doctor and the target probe it starts).

The log mixes what a `DS_BUILD_*` build and a run print (hipcc command lines, ninja progress, compiler
warnings, pip output, training steps) with a few known error lines near the end and one UTF-8-broken
line. Results go to the `## doctor --log` section of docs/benchmarks.md unless --no-write.

    python scripts/bench_doctor_log.py [--size-mb 700] [--runs 3] [--keep] [--no-write] [--skip-whole]
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
import time
from pathlib import Path

from _repo import REPO
from benchdoc import replace_section

BENCHMARKS = REPO / "docs" / "benchmarks.md"
SECTION = "## doctor --log"
OLD_COMMIT = "835b364"  # the last commit that read the whole log

NORMAL_LINES = [
    "[12/40] /opt/rocm/bin/hipcc  -DWITH_HIP -DTORCH_EXTENSION_NAME=fused_adam -DTORCH_API_INCLUDE_EXTENSION_H "
    "-I/usr/lib/python3/dist-packages/deepspeed/ops/csrc/includes -isystem /venv/lib/python3.11/site-packages/"
    "torch/include -fPIC -std=c++17 -O3 --offload-arch=gfx90a --offload-arch=gfx942 -fno-gpu-rdc "
    "-c /tmp/ds/csrc/adam/multi_tensor_adam.hip -o multi_tensor_adam.cuda.o",
    "In file included from /tmp/ds/csrc/includes/type_shim.h:9:",
    "/opt/rocm/include/hip/amd_detail/amd_hip_bf16.h:123:5: warning: 'unused' attribute ignored [-Wattributes]",
    "  Building wheel for deepspeed (setup.py) ... -",
    "copying deepspeed/runtime/zero/stage3.py -> build/lib.linux-x86_64-cpython-311/deepspeed/runtime/zero",
    "[2026-11-22 10:00:00,123] [INFO] [logging.py:128:log_dist] [Rank 0] step=1200, skipped=0, lr=[0.0001], "
    "mom=[(0.9, 0.95)]",
    "Using /root/.cache/torch_extensions/py311_rocm62 as PyTorch extensions root...",
    "Loading extension module fused_adam...",
]
ERROR_LINES = [
    "RuntimeError: Error building extension 'cpu_adam'",
    "/opt/rocm/include/hip/amd_detail/amd_warp_sync_functions.h:229:3: error: static assertion failed due to "
    "requirement 'sizeof(unsigned int) == 8': The mask must be a 64-bit integer. Implicitly promoting a smaller "
    "integer is almost always an error.",
]


def generate(path: Path, size_mb: int) -> int:
    """Write about `size_mb` MB of log; returns its size in bytes."""
    block = ("\n".join(NORMAL_LINES * 500) + "\n").encode()
    target = size_mb * 1024 * 1024
    with path.open("wb") as out:
        written = 0
        while written < target:
            out.write(block)
            written += len(block)
        tail = b"broken \xff\xfe utf-8\n" + "\n".join(ERROR_LINES).encode() + b"\n"
        out.write(tail)
        written += len(tail)
    return written


CHILD = r"""
import json, resource, sys, time
mode, log = sys.argv[1], sys.argv[2]
from mlstack_ds.doctor.rules import RULES
started = time.perf_counter()
if mode == "stream":
    from mlstack_ds.doctor.logs import match_log_stream
    with open(log, "rb") as stream:
        findings = match_log_stream(stream, RULES)
else:
    import importlib.util
    spec = importlib.util.spec_from_file_location("old_logs", sys.argv[3])
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    with open(log, encoding="utf-8", errors="replace") as stream:
        findings = old.match_log(stream.read(), RULES)
elapsed = time.perf_counter() - started
print(json.dumps({"seconds": elapsed, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "findings": sorted(f.rule_id for f in findings)}))
"""


def run_child(mode: str, log: Path, old_module: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", CHILD, mode, str(log), str(old_module)], env=env,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def time_cli(log: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mlstack_ds", "doctor", "--json", "--log", str(log)], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def render_section(result: dict) -> str:
    rows = []
    for name, label in (("stream", "`match_log_stream` (now)"), ("whole", f"read whole + `match_log` ({OLD_COMMIT})")):
        runs = result.get(name)
        if not runs:
            continue
        seconds = [r["seconds"] for r in runs]
        rss = max(r["peak_rss_kib"] for r in runs) / 1024
        rows.append(f"| {label} | {statistics.median(seconds):.1f} | {min(seconds):.1f} | {max(seconds):.1f} "
                    f"| {rss:.0f} |")
    cli = result["cli"]
    rows.append(f"| whole `mlstack-ds doctor --json --log` | {statistics.median(cli):.1f} | {min(cli):.1f} "
                f"| {max(cli):.1f} | - |")
    return (
        f"{SECTION}\n\n"
        f"`scripts/bench_doctor_log.py`, {result['when']}, {result['machine']}, a generated build log of "
        f"{result['size_mb']:.0f} MB ({result['lines']:,} lines; hipcc command lines, warnings, pip and training "
        f"output, a non-UTF-8 line, two known errors at the end), {result['runs']} run(s) each, each in a fresh "
        f"interpreter; load average {result['load_before']:.1f} before / {result['load_after']:.1f} after "
        f"({os.cpu_count()} cores). Peak RSS is the interpreter's `ru_maxrss`, the interpreter and the rule registry "
        "included. The old reader runs today's rule set (more patterns than when it was written).\n\n"
        "| what | median s | min s | max s | peak RSS MiB |\n|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n\n"
        f"Findings (both implementations): {', '.join(result['findings'])}. Streaming keeps memory flat "
        "whatever the log's size (1 MiB blocks, the first matching line and a count per rule). The machine was "
        "shared (see the load average): the times are upper bounds, the memory is not load-dependent.\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=700)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    parser.add_argument("--no-write", action="store_true", help="print, do not update docs/benchmarks.md")
    parser.add_argument("--skip-whole", action="store_true", help="do not run the old whole-file reader")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-doctor-log-"))
    log = workdir / "build.log"
    old_module = workdir / "old_logs.py"
    old_module.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:mlstack_ds/doctor/logs.py"],
                                         capture_output=True, text=True, check=True).stdout)
    try:
        size = generate(log, args.size_mb)
        with log.open("rb") as stream:
            lines = sum(block.count(b"\n") for block in iter(lambda: stream.read(1 << 20), b""))
        load_before = os.getloadavg()[0]
        result: dict = {"stream": [], "whole": [], "cli": []}
        for _ in range(args.runs):
            result["stream"].append(run_child("stream", log, old_module))
            if not args.skip_whole:
                result["whole"].append(run_child("whole", log, old_module))
            result["cli"].append(time_cli(log))
        found = {tuple(r["findings"]) for r in result["stream"] + result["whole"]}
        if len(found) != 1:
            print(f"the implementations disagree: {found}", file=sys.stderr)
            return 1
        result.update(
            findings=list(found.pop()), size_mb=size / 1024 / 1024, lines=lines, runs=args.runs,
            when=time.strftime("%Y-%m-%d"), load_before=load_before, load_after=os.getloadavg()[0],
            machine=f"{platform.machine()}, CPython {platform.python_version()}",
        )
        section = render_section(result)
        print(section)
        if not args.no_write:
            text = BENCHMARKS.read_text(encoding="utf-8") if BENCHMARKS.exists() else "# Benchmarks\n"
            BENCHMARKS.write_text(replace_section(text, SECTION, section), encoding="utf-8")
    finally:
        if not args.keep:
            log.unlink(missing_ok=True)
            old_module.unlink(missing_ok=True)
            workdir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
